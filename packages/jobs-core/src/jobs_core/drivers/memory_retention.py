"""The memory driver's retention store (the ``retention`` capability): settled rows, oldest first.

:class:`~jobs_core.drivers.memory._Memory` keeps every finished row in ``settled``, one
insertion-ordered map per state, in the order the rows settled; a requeue or a removal takes the
row out. A purge walks that order from its oldest end and stops at the first row settled at or
after ``before``, so one call costs the rows it deletes, not the store's size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from uuid import UUID

from jobs_core.driver import check_retention_request
from jobs_core.types import RetentionRequest

if TYPE_CHECKING:
    from jobs_core.drivers.memory import _Memory


class MemoryRetentionStore:
    """The memory driver's :class:`~jobs_core.driver.RetentionStore`.

    Args:
        memory: the driver's state.
    """

    def __init__(self, memory: _Memory) -> None:
        """Delete from ``memory`` (the argument is the class docstring's)."""
        self._m = memory

    async def purge_settled(self, req: RetentionRequest) -> int:
        """Delete up to ``req.limit`` rows in ``req.states`` settled before ``req.before``.

        Each deleted row's steps go with it; the listing loses the rows in one rebuild.

        Returns:
            How many rows were deleted.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a bad request.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after the driver closed.
        """
        check_retention_request(req)
        m = self._m
        with m.lock:
            m.now()
            gone: set[UUID] = set()
            for state in sorted(req.states):
                settled = m.settled.get(state, {})
                for row in list(settled.values()):
                    if len(gone) == req.limit or row.updated_at >= req.before:
                        break
                    m.drop(row)
                    gone.add(row.id)
            if gone:
                m.listing = [row for row in m.listing if row.id not in gone]
            return len(gone)
