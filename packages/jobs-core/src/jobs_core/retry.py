"""Retry policy: how many attempts, how long between them, and the jitter.

Equal jitter is the default (half the backoff fixed, half random), so jobs that failed together
do not come back together (FIELD-FAILURES C20) while a retry never comes sooner than half its
nominal delay. Full jitter was rejected: it lets a retry land almost at once, which hammers a
dependency that is still recovering.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

from jobs_core._durations import Duration, duration_problem, parse_duration

Backoff = Literal["exponential", "linear", "fixed"]

RETRY_AFTER_SPREAD = 0.25
"""How much later than the time a dependency named a ``retry_after`` retry may come (a fraction)."""


@dataclass(frozen=True, slots=True)
class Retry:
    """How a job retries.

    Args:
        attempts: attempts in all, first included (``>= 1``).
        backoff: ``"exponential"`` (delay × 2^(n-1)), ``"linear"`` (delay × n) or ``"fixed"``.
        delay: the first retry's nominal delay (``"1s"`` by default).
        max_delay: the cap on any one delay, jitter and ``retry_after`` included (``"5m"``).
        jitter: equal jitter on every delay (default ``True``).
        dead_letter: an exhausted row settles ``dead`` (``True``) or ``failed`` (``False``).
    """

    attempts: int = 3
    backoff: Backoff = "exponential"
    delay: Duration = "1s"
    max_delay: Duration = "5m"
    jitter: bool = True
    dead_letter: bool = True

    def problems(self) -> list[str]:
        """Answer every problem with this policy (empty when valid), each naming its field."""
        found: list[str] = []
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            found.append(f"retry.attempts: must be an int >= 1, got {self.attempts!r}")
        elif self.attempts < 1:
            found.append(f"retry.attempts: must be >= 1, got {self.attempts}")
        if self.backoff not in ("exponential", "linear", "fixed"):
            found.append(
                f"retry.backoff: must be 'exponential', 'linear' or 'fixed', got {self.backoff!r}"
            )
        for name in ("jitter", "dead_letter"):
            if not isinstance(getattr(self, name), bool):
                found.append(f"retry.{name}: must be True or False, got {getattr(self, name)!r}")
        for name in ("delay", "max_delay"):
            problem = duration_problem(getattr(self, name))
            if problem is not None:
                found.append(f"retry.{name}: {problem}")
        return found

    @property
    def delay_ms(self) -> int:
        """The first retry's nominal delay in milliseconds."""
        return parse_duration(self.delay, field="retry.delay")

    @property
    def max_delay_ms(self) -> int:
        """The cap on one delay in milliseconds."""
        return parse_duration(self.max_delay, field="retry.max_delay")

    def nominal_delay_ms(self, failed_attempt: int) -> int:
        """Answer the capped, un-jittered delay after attempt ``failed_attempt`` (1-based)."""
        base = self.delay_ms
        if self.backoff == "exponential":
            nominal = base * (1 << min(failed_attempt - 1, 62))
        elif self.backoff == "linear":
            nominal = base * failed_attempt
        else:
            nominal = base
        return min(nominal, self.max_delay_ms)

    def delay_after_ms(self, failed_attempt: int, rng: random.Random | None = None) -> int:
        """Answer the delay (ms) before the retry that follows attempt ``failed_attempt``.

        With ``jitter`` the answer is uniform in ``[ceil(nominal/2), nominal]`` (equal jitter).
        """
        return self.jittered(self.nominal_delay_ms(failed_attempt), rng)

    def jittered(self, nominal_ms: int, rng: random.Random | None = None) -> int:
        """Apply this policy's cap and jitter to a nominal delay in milliseconds."""
        capped = min(max(nominal_ms, 0), self.max_delay_ms)
        if not self.jitter:
            return capped
        # Round the fixed half up so an odd (or 1 ms) delay never lands below nominal/2.
        half = capped - capped // 2
        return half + (rng or random).randint(0, capped - half)

    def after_ms(self, named_ms: int, rng: random.Random | None = None) -> int:
        """Answer the delay (ms) of a retry at a time a dependency named (``Retry-After``).

        Never sooner than ``named_ms`` while that is under ``max_delay``: a retry before the
        time named (RFC 9110 §10.2.3) is refused again and spends an attempt. With ``jitter``
        up to :data:`RETRY_AFTER_SPREAD` of it more is added, so rows throttled together do not
        return in one wave. A named wait at or past ``max_delay`` is clamped to it (the one way
        a retry comes sooner than named: raise ``max_delay`` to honour longer waits), jittered
        into the cap's last quarter.
        """
        cap = self.max_delay_ms
        named = max(named_ms, 0)
        if named >= cap:
            low = cap - math.floor(cap * RETRY_AFTER_SPREAD) if self.jitter else cap
            return (rng or random).randint(low, cap)
        if not self.jitter:
            return named
        return (rng or random).randint(
            named, min(cap, named + math.floor(named * RETRY_AFTER_SPREAD))
        )


def retry_schedule(policy: Retry) -> list[int]:
    """Answer the nominal delays (ms, no jitter) between the attempts of ``policy``.

    ``retry_schedule(Retry(attempts=5, backoff="exponential", delay="1s"))`` is
    ``[1000, 2000, 4000, 8000]``: one delay per retry, ``attempts - 1`` in all.
    """
    return [policy.nominal_delay_ms(n) for n in range(1, policy.attempts)]
