"""Fleet-wide rate buckets on Redis (the ``rate`` capability): ``rate_take.lua``.

One list per bucket (``<base>rt:<bucket>``) holds the newest ``limit`` grant instants; one script
call decides and records, atomically on the server, so two workers never both take the last
token. Without ``now_ms`` the server's ``TIME`` measures the window, the same clock that decides
what is due, so a worker host's clock never enters. The key expires one window after its newest
grant, so idle buckets leave nothing behind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobs_core.driver import RateRequest, check_rate_request

if TYPE_CHECKING:
    from jobs_redis._driver import _Shared


class RedisRateStore:
    """The Redis driver's :class:`~jobs_core.driver.RateStore`: a sliding-window log per key.

    Args:
        shared: the driver's connection and keys.
    """

    def __init__(self, shared: _Shared) -> None:
        """Serve ``shared`` (the argument is the class docstring's)."""
        self._s = shared

    async def take_token(self, req: RateRequest) -> int:
        """Take one token of ``req.key`` (see :meth:`jobs_core.driver.RateStore.take_token`).

        Returns:
            0 when granted, else the milliseconds until the next token is free.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a bad request.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        check_rate_request(req)
        key = f"{self._s.keys.base}rt:{req.key}"
        now = "" if req.now_ms is None else req.now_ms
        return int(await self._s.run("rate_take", [key], [req.limit, req.per_ms, now]))
