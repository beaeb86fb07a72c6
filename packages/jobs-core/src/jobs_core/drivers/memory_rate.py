"""The memory driver's rate buckets (the ``rate`` capability of ``memory://``).

One sliding-window log per bucket key, kept in the process under the driver's lock and measured
on the driver's clock (a manual clock in tests); the arithmetic is
:func:`jobs_core.rate.take_from_window`, the one every driver implements. A memory driver serves
the workers of one process, so "fleet-wide" here means every worker sharing the driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobs_core.driver import RateRequest, check_rate_request
from jobs_core.rate import take_from_window

if TYPE_CHECKING:
    from jobs_core.drivers.memory import _Memory

IDLE_SWEEP = 10_000
"""Past this many buckets, a take first forgets every bucket whose grants all left its window."""


class MemoryRateStore:
    """The memory driver's :class:`~jobs_core.driver.RateStore`.

    Args:
        memory: the driver's state (its lock and clock).
    """

    def __init__(self, memory: _Memory) -> None:
        """Keep buckets beside ``memory`` (the argument is the class docstring's)."""
        self._m = memory
        # key -> (grant instants in ms, non-decreasing; the window they were kept for, ms)
        self._buckets: dict[str, tuple[list[int], int]] = {}

    async def take_token(self, req: RateRequest) -> int:
        """Take one token of ``req.key`` (see :meth:`jobs_core.driver.RateStore.take_token`).

        Returns:
            0 when granted, else the milliseconds until the next token is free.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a bad request.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after the driver closed.
        """
        check_rate_request(req)
        m = self._m
        with m.lock:
            instant = m.now()
            now_ms = req.now_ms if req.now_ms is not None else int(instant.timestamp() * 1000)
            if len(self._buckets) > IDLE_SWEEP:
                self._sweep(now_ms)
            stamps, _ = self._buckets.get(req.key, ([], req.per_ms))
            kept, wait_ms = take_from_window(stamps, req.limit, req.per_ms, now_ms)
            self._buckets[req.key] = (kept, req.per_ms)
            return wait_ms

    def _sweep(self, now_ms: int) -> None:
        idle = [k for k, (s, per) in self._buckets.items() if not s or s[-1] <= now_ms - per]
        for key in idle:
            del self._buckets[key]
