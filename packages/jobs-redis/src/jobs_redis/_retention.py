"""Deleting settled rows on Redis (the ``retention`` capability): ``retention.lua``.

The scripts that settle a row (``ack.lua``, ``nack.lua``, ``cancel.lua``) add its id to
``<base>fin:<state>``, scored by the settle time; a purge walks a state's set from its oldest
end, one bounded script call per state, deleting each row and its run's steps. A ``done`` row
with a ``done_ttl`` also expires on its own; ``ack.lua`` trims the members that outlived it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobs_core.driver import check_retention_request
from jobs_core.types import RetentionRequest
from jobs_redis._codec import to_us

if TYPE_CHECKING:
    from jobs_redis._driver import _Shared


class RedisRetentionStore:
    """The Redis :class:`~jobs_core.driver.RetentionStore`.

    Args:
        shared: the driver's connection and keys.
    """

    def __init__(self, shared: _Shared) -> None:
        """Serve ``shared`` (the argument is described in the class docstring)."""
        self._s = shared

    async def purge_settled(self, req: RetentionRequest) -> int:
        """Delete up to ``req.limit`` rows in ``req.states`` settled before ``req.before``.

        Returns:
            How many rows were deleted (with their runs' steps).

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a bad request.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when Redis cannot be reached.
        """
        check_retention_request(req)
        before = to_us(req.before, "before")
        base = self._s.keys.base
        deleted = 0
        for state in sorted(str(s) for s in req.states):
            if deleted == req.limit:
                break
            deleted += int(
                await self._s.run(
                    "retention", [f"{base}fin:{state}"], [base, state, before, req.limit - deleted]
                )
            )
        return deleted
