"""Durations as the library accepts them.

``"250ms"``, ``"30s"``, ``"10m"``, ``"3d"``, a :class:`~datetime.timedelta`, or milliseconds as
an ``int``.

Everything is normalised to whole milliseconds (``int``) at the edge so that the runtime and the
drivers never see a unit again.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

Duration = str | int | float | timedelta
"""A duration as users write it: ``"250ms"``, ``"30s"``, ``"10m"``, ``"1h"``, ``"3d"``,
``timedelta`` or ``int`` milliseconds."""

_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")
MAX_DURATION_MS = 100 * 365 * 86_400_000
"""The longest duration accepted anywhere (100 years): larger values are a unit mistake."""


def duration_problem(value: object, *, allow_zero: bool = False) -> str | None:
    """Answer why ``value`` is not an acceptable duration, or ``None`` when it is.

    Args:
        value: the candidate duration.
        allow_zero: whether ``0`` is acceptable (e.g. an enqueue ``delay``).
    """
    try:
        ms = _to_ms(value)
    except (TypeError, ValueError) as exc:
        return str(exc)
    if ms < 0 or (ms == 0 and not allow_zero):
        return f"must be {'zero or ' if allow_zero else ''}positive, got {value!r}"
    if ms > MAX_DURATION_MS:
        return f"must be at most 100 years, got {value!r}"
    return None


def parse_duration(value: Duration, *, field: str, allow_zero: bool = False) -> int:
    """Normalise a duration to whole milliseconds.

    Args:
        value: ``"250ms"``, ``"30s"``, ``"10m"``, ``"1h"``, ``"3d"``, ``"2w"``, a ``timedelta``
            or an ``int``/``float`` of milliseconds.
        field: the option's name, used in the error message.
        allow_zero: accept ``0`` (negative, NaN and infinite are always refused).

    Returns:
        The duration in milliseconds (``int``, rounded up so a positive value never becomes 0).

    Raises:
        ValueError: the value is malformed, not positive (or zero when allowed), NaN, infinite,
            or longer than 100 years; the message names ``field``.
    """
    problem = duration_problem(value, allow_zero=allow_zero)
    if problem is not None:
        raise ValueError(
            f"{field}: {problem} (write '250ms', '30s', '10m', '3d', a timedelta or int ms)"
        )
    return _to_ms(value)


def _to_ms(value: object) -> int:
    if isinstance(value, bool):
        raise TypeError(f"a duration cannot be a bool ({value!r})")
    if isinstance(value, timedelta):
        return _away_from_zero(value / timedelta(milliseconds=1))
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"a duration must be finite, got {value!r}")
        return _away_from_zero(value)
    if isinstance(value, str):
        if value.strip() == "0":
            return 0  # zero needs no unit (``done_ttl=0`` in a URL query)
        match = _PATTERN.match(value)
        if match is None:
            raise ValueError(f"unreadable duration {value!r}")
        number, unit = match.groups()
        ms = float(number) * _UNITS_MS[unit]
        if not math.isfinite(ms):
            raise ValueError(f"a duration must be finite, got {value!r}")
        return math.ceil(ms)
    raise TypeError(f"a duration must be str, int ms or timedelta, got {type(value).__name__}")


def _away_from_zero(ms: float) -> int:
    # Round a fraction of a millisecond away from zero: a positive value never becomes 0, and a
    # negative one (-0.5 ms, timedelta(microseconds=-1)) never becomes an acceptable 0.
    return math.ceil(ms) if ms >= 0 else math.floor(ms)
