"""Debounced enqueues: many enqueues of one key in a burst make one run, with the last input.

``enqueue(input, debounce="30s", debounce_max="2m")`` queues the row to run 30 s from now. A
later enqueue of the same job and idempotency key (and tenant) while that row still waits for
its first claim replaces the row's input and pushes its run time out to now plus ``debounce``,
but never past the row's first enqueue plus ``debounce_max`` when one is given. Once the row was
claimed (running, retried, suspended or settled) it no longer holds its key: the next enqueue
inserts a new row, debounced the same way. The answer of a replacing enqueue is the waiting
row's ids with ``deduped=True``.

Durations are parsed as everywhere else (:mod:`jobs_core._durations`).
"""

from __future__ import annotations

from jobs_core._durations import Duration, parse_duration
from jobs_core.errors import JobOptionsInvalidError


def debounce_options(
    debounce: Duration | None, debounce_max: Duration | None
) -> tuple[int | None, int | None]:
    """Answer ``(debounce_ms, debounce_max_ms)`` for an enqueue's options.

    Returns:
        ``(None, None)`` when ``debounce`` is ``None``; else both in milliseconds (the second
        ``None`` when no cap is given).

    Raises:
        JobOptionsInvalidError: ``X_JOB_OPTIONS_INVALID`` naming ``debounce`` or
            ``debounce_max``: a malformed or non-positive duration, ``debounce_max`` without
            ``debounce``, or ``debounce_max`` shorter than ``debounce``.
    """
    if debounce is None:
        if debounce_max is not None:
            raise JobOptionsInvalidError(
                "debounce_max: needs debounce= (the window each enqueue pushes out)",
                option="debounce_max",
            )
        return None, None
    try:
        window = parse_duration(debounce, field="debounce")
    except ValueError as exc:
        raise JobOptionsInvalidError(str(exc), option="debounce") from None
    if debounce_max is None:
        return window, None
    try:
        cap = parse_duration(debounce_max, field="debounce_max")
    except ValueError as exc:
        raise JobOptionsInvalidError(str(exc), option="debounce_max") from None
    if cap < window:
        raise JobOptionsInvalidError(
            f"debounce_max: {cap} ms is shorter than debounce ({window} ms); the cap bounds the "
            "total wait from the first enqueue",
            option="debounce_max",
        )
    return window, cap
