"""Job priorities: which ready row of a queue a claim takes first.

A priority is an ``int`` from :data:`PRIORITY_MIN` to :data:`PRIORITY_MAX` (a Postgres
``smallint``); **lower runs first** and the default is :data:`DEFAULT_PRIORITY` (0). A job
declares its default (``job(priority=...)``) and an enqueue may override it
(``enqueue(..., priority=...)``). Within one priority a claim stays FIFO by ``(run_at,
insertion)``.

Starvation: a claim always takes the lowest number first, so a queue that never drains its
urgent rows never runs its others. Keep the bulk at the default and a few urgent rows below it,
or give background work its own queue (and workers) instead of a high number.
"""

from __future__ import annotations

from jobs_core.errors import JobOptionsInvalidError

PRIORITY_MIN = -32768
"""The lowest (most urgent) priority a row may carry."""
PRIORITY_MAX = 32767
"""The highest (least urgent) priority a row may carry."""
DEFAULT_PRIORITY = 0
"""The priority of a job that declares none."""


def priority_problem(value: object) -> str | None:
    """Answer why ``value`` is not a priority (naming the field), or ``None`` when it is one."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"priority: must be an int, got {type(value).__name__} {value!r}"
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        return (
            f"priority: must be between {PRIORITY_MIN} and {PRIORITY_MAX} (lower runs first), "
            f"got {value}"
        )
    return None


def check_priority(value: object) -> int:
    """Answer ``value`` as a priority, for an enqueue's ``priority=`` option.

    Raises:
        JobOptionsInvalidError: ``X_JOB_OPTIONS_INVALID`` (``meta["option"] == "priority"``)
            for a value that is not an int in ``PRIORITY_MIN..PRIORITY_MAX``.
    """
    problem = priority_problem(value)
    if problem is not None:
        raise JobOptionsInvalidError(problem, option="priority")
    assert isinstance(value, int)
    return value
