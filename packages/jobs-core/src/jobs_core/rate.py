"""Fleet-wide rate limits: ``job(rate=Rate(10, per="1s", key=...))``.

A :class:`Rate` caps how many attempts of a job START per rolling window, across every worker of
the fleet: the count lives in the driver (the ``rate`` capability,
:class:`~jobs_core.driver.RateStore`), never in a process. Each attempt whose body is about to run
asks the store for a token of its bucket (``rate:<name>``, or ``rate-key:<name>:<key>`` with a
``key`` function); a refused attempt is handed back unrun, due again at the instant the store
says the next token is free (``when_limited="wait"``), or fails with ``X_JOB_RATE_LIMITED`` under
the job's retry policy (``"fail"``).

The bucket is a **sliding-window log**: the instants (ms) of the grants still inside the window,
at most ``limit`` of them. A grant at ``now`` needs fewer than ``limit`` grants in
``(now - per, now]``, so every rolling window of length ``per`` holds at most ``limit`` starts:
the guarantee a user of a rate-limited API needs. When refused, the next token is free when the
oldest of the last ``limit`` grants leaves the window: ``that grant + per - now``.

Rejected: a token bucket (or GCRA) with a burst of ``limit``. Its state is one number, but it
refills continuously, so a window of ``per`` can hold up to ``2 * limit - 1`` starts (a full
burst, then the refill). GCRA without a burst keeps the window exact but spaces grants evenly and
loses every millisecond a handed-back row is picked up late, so the fleet falls behind the rate.
The log costs ``limit`` integers per bucket (a ``limit`` is at most :data:`MAX_RATE_LIMIT`).

Each store keeps its bucket's instants non-decreasing: a request whose ``now`` is before the
newest grant (another process's clock, a statement that waited on the bucket's lock) is treated
as arriving at that grant, so pruning never drops an instant a later request still counts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from jobs_core._durations import Duration, duration_problem, parse_duration

WhenLimited = Literal["wait", "fail"]

MAX_RATE_LIMIT = 10_000
"""The largest ``limit`` a bucket admits (each bucket keeps up to ``limit`` instants)."""

MAX_RATE_PER_MS = 86_400_000
"""The longest window a bucket admits: one day."""

DEFAULT_MARGIN_MS = 50
"""The most the default dispatch margin adds to a window (see :class:`Rate`)."""


@dataclass(frozen=True, slots=True)
class Rate:
    """A fleet-wide cap on how many attempts of one job start per rolling window.

    Args:
        limit: starts allowed per window (``1..10,000``).
        per: the window (``"1s"``, ``"1m"``, a timedelta or int ms; at most a day).
        key: ``(input) -> str``, one bucket per key (e.g. the customer id); ``None``: one bucket
            for the job.
        when_limited: ``"wait"`` hands the row back unrun (attempt not spent) due when the next
            token is free; ``"fail"`` fails the attempt with ``X_JOB_RATE_LIMITED`` and the job's
            retry policy decides (the attempt is spent).
        margin: added to the window the backend enforces. The backend grants a token on its own
            clock and the body starts a dispatch delay later (the reply's trip, a busy event
            loop); that delay varies, so two grants exactly ``per`` apart can reach their bodies
            a little less than ``per`` apart. The margin keeps the starts the bodies (and the API
            they call) see within the limit. Default ``None``: ``per / limit``, at most 50 ms
            (5 % of a 1 s window at 20 per second); ``0`` enforces exactly ``per``.

    Attributes:
        per_ms: the window in milliseconds (0 when ``per`` is invalid; :meth:`problems` says why).
        window_ms: what the backend enforces: ``per_ms`` plus the margin in milliseconds.
    """

    limit: int
    per: Duration = "1s"
    key: Callable[[Any], str] | None = None
    when_limited: WhenLimited = "wait"
    margin: Duration | None = None
    per_ms: int = field(init=False, default=0, compare=False)
    window_ms: int = field(init=False, default=0, compare=False)

    def __post_init__(self) -> None:
        """Normalise ``per`` and the margin to milliseconds (invalid ones leave 0)."""
        if duration_problem(self.per) is not None:
            return
        per_ms = parse_duration(self.per, field="rate.per")
        object.__setattr__(self, "per_ms", per_ms)
        if self.margin is None:
            valid = isinstance(self.limit, int) and self.limit >= 1
            margin_ms = min(DEFAULT_MARGIN_MS, per_ms // self.limit) if valid else 0
        elif duration_problem(self.margin, allow_zero=True) is None:
            margin_ms = parse_duration(self.margin, field="rate.margin", allow_zero=True)
        else:
            return
        object.__setattr__(self, "window_ms", per_ms + margin_ms)

    def problems(self) -> list[str]:
        """Answer every problem with this rate (empty when valid), each naming its field."""
        found: list[str] = []
        limit = self.limit
        valid_limit = isinstance(limit, int) and not isinstance(limit, bool)
        if not valid_limit or not 1 <= limit <= MAX_RATE_LIMIT:
            found.append(f"rate.limit: must be an int in 1..{MAX_RATE_LIMIT:,}, got {limit!r}")
        problem = duration_problem(self.per)
        if problem is not None:
            found.append(f"rate.per: {problem}")
        elif self.per_ms > MAX_RATE_PER_MS:
            found.append(f"rate.per: must be at most a day, got {self.per!r}")
        if self.margin is not None:
            problem = duration_problem(self.margin, allow_zero=True)
            if problem is not None:
                found.append(f"rate.margin: {problem}")
            elif self.window_ms > MAX_RATE_PER_MS:
                found.append("rate.margin: the window with its margin must be at most a day")
        if self.key is not None and not callable(self.key):
            found.append("rate.key: must be a function (input) -> str, or None")
        if self.when_limited not in ("wait", "fail"):
            found.append(f"rate.when_limited: must be 'wait' or 'fail', got {self.when_limited!r}")
        return found

    def bucket(self, job: str, value: Any) -> str:
        """Answer the bucket key an attempt of ``job`` with input ``value`` takes a token from.

        ``rate:<job>`` without a ``key`` function, else ``rate-key:<job>:<key(value)>``.
        """
        if self.key is None:
            return f"rate:{job}"
        return f"rate-key:{job}:{self.key(value)}"

    def describe(self) -> dict[str, Any]:
        """Answer the JSON-able form ``jobsctl manifest`` shows."""
        return {
            "limit": self.limit,
            "per_ms": self.per_ms,
            "window_ms": self.window_ms,
            "per_key": self.key is not None,
            "when_limited": self.when_limited,
        }


def take_from_window(
    stamps: Sequence[int], limit: int, per_ms: int, now_ms: int
) -> tuple[list[int], int]:
    """Take a token from a sliding-window log: the arithmetic every driver implements.

    Args:
        stamps: the bucket's grant instants (ms, non-decreasing), as stored.
        limit: grants allowed per window (``>= 1``).
        per_ms: the window (ms, ``>= 1``).
        now_ms: the request's instant (ms); one before the newest grant counts as that grant's.

    Returns:
        ``(stamps to store, wait_ms)``: ``wait_ms`` is 0 when granted (``now`` is appended),
        else how long until the next token is free (nothing is appended). The stored list keeps
        only grants inside the window, at most ``limit`` of them.
    """
    now = max(now_ms, stamps[-1]) if stamps else now_ms
    window = [s for s in stamps if s > now - per_ms]
    if len(window) < limit:
        window.append(now)
        return window, 0
    kept = window[len(window) - limit :]
    return kept, kept[0] + per_ms - now
