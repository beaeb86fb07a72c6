"""Concurrency limits: fleet-wide per job (``Concurrency``) and in-process (``Limits``).

Fleet caps go through the driver's lease store, keyed ``job:<name>`` (plain) or
``job-key:<name>:<key>`` (per key), held by the run id so a run is never refused because of its
own earlier claim's leftover slot, and expiring with the visibility timeout so a crashed holder
never blocks the key for good (FIELD-FAILURES C02). In-process limits are a fast path: over a cap,
the claimed row is handed back without spending an attempt.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from jobs_core.clock import SYSTEM_CLOCK, Clock

WhenBusy = Literal["wait", "fail"]


@dataclass(frozen=True, slots=True)
class Concurrency:
    """A fleet-wide cap per key.

    Args:
        key: ``(input) -> str``, the key the cap is counted by (e.g. the customer id).
        limit: running rows allowed per key (``>= 1``).
        when_busy: ``"wait"`` hands the row back to run later (attempt not spent); ``"fail"``
            settles it ``failed`` with ``X_JOB_KEY_BUSY`` (outcome ``refused``; the body never ran).
    """

    key: Callable[[Any], str]
    limit: int = 1
    when_busy: WhenBusy = "wait"

    def problems(self) -> list[str]:
        """Answer every problem with this cap (empty when valid), each naming its field."""
        found: list[str] = []
        if not callable(self.key):
            found.append("concurrency.key: must be a function (input) -> str")
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            found.append(f"concurrency.limit: must be an int >= 1, got {self.limit!r}")
        if self.when_busy not in ("wait", "fail"):
            found.append(f"concurrency.when_busy: must be 'wait' or 'fail', got {self.when_busy!r}")
        return found


@dataclass(frozen=True, slots=True)
class Limits:
    """In-process caps for one worker (a per-process fast path, not a fleet guarantee).

    Args:
        per_tenant: running rows per tenant in this process.
        per_queue: running rows per queue (one int for all, or per queue name).
        global_: running rows in all.
        rate_per_tenant: attempts started per tenant per second (a token bucket whose burst is
            the rate, at least 1).
    """

    per_tenant: int | None = None
    per_queue: int | Mapping[str, int] | None = None
    global_: int | None = None
    rate_per_tenant: float | None = None


class LimitGate:
    """Counts running rows against a :class:`Limits` and admits or refuses new ones.

    Thread-safe; ``admit`` and ``release`` must pair up.
    """

    def __init__(self, limits: Limits, clock: Clock = SYSTEM_CLOCK) -> None:
        """Create a gate for ``limits`` measured on ``clock``'s monotonic readings."""
        self._limits = limits
        self._clock = clock
        self._lock = threading.Lock()
        self._total = 0
        self._by_tenant: dict[str, int] = defaultdict(int)
        self._by_queue: dict[str, int] = defaultdict(int)
        self._buckets: dict[str, tuple[float, float]] = {}

    def admit(self, queue: str, tenant: str | None) -> bool:
        """Count one more running row, or answer ``False`` (counting nothing) when over a cap."""
        limits = self._limits
        tenant_key = tenant or ""
        with self._lock:
            if limits.global_ is not None and self._total >= limits.global_:
                return False
            queue_cap = self._queue_cap(queue)
            if queue_cap is not None and self._by_queue[queue] >= queue_cap:
                return False
            if limits.per_tenant is not None and self._by_tenant[tenant_key] >= limits.per_tenant:
                return False
            if limits.rate_per_tenant is not None and not self._take_token(tenant_key):
                return False
            self._total += 1
            self._by_queue[queue] += 1
            self._by_tenant[tenant_key] += 1
            return True

    def release(self, queue: str, tenant: str | None) -> None:
        """Count one running row as finished."""
        with self._lock:
            self._total -= 1
            self._by_queue[queue] -= 1
            self._by_tenant[tenant or ""] -= 1

    def _queue_cap(self, queue: str) -> int | None:
        per_queue = self._limits.per_queue
        if per_queue is None or isinstance(per_queue, int):
            return per_queue
        return per_queue.get(queue)

    def _take_token(self, tenant: str) -> bool:
        rate = self._limits.rate_per_tenant
        assert rate is not None
        burst = max(rate, 1.0)
        now = self._clock.monotonic()
        tokens, stamp = self._buckets.get(tenant, (burst, now))
        tokens = min(burst, tokens + (now - stamp) * rate)
        if tokens < 1.0:
            self._buckets[tenant] = (tokens, now)
            return False
        self._buckets[tenant] = (tokens - 1.0, now)
        return True
