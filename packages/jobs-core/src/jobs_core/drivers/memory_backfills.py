"""The memory driver's backfill ledger (the ``backfills`` capability).

Passes are kept by id, JSON cursors as JSON text (decoded on every read, as a database does), and
every call takes the driver's one lock, so the ledger agrees with the rows it sits beside and is
refused with ``X_DRIVER_UNAVAILABLE`` once the driver is closed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING
from uuid import UUID

from jobs_core.driver import check_backfill_query, check_backfill_start
from jobs_core.errors import DriverRequestInvalidError
from jobs_core.types import (
    BackfillPass,
    BackfillProgress,
    BackfillQuery,
    BackfillStart,
    BackfillStatus,
    JSONValue,
)

if TYPE_CHECKING:
    from jobs_core.drivers.memory import _Memory


@dataclass(slots=True)
class _Pass:
    """One ledger row; ``cursor`` is JSON text; ``seq`` orders passes begun in one instant."""

    row: BackfillPass
    cursor: str
    seq: int


def _cursor_text(cursor: JSONValue) -> str:
    # The rows' own rule (JSON, no NaN, no NUL), imported late: memory.py imports this module.
    from jobs_core.drivers.memory import _encode

    return _encode(cursor, "cursor")


class MemoryBackfillLedger:
    """The memory driver's :class:`~jobs_core.driver.BackfillLedger`.

    Args:
        memory: the driver's state (its lock and its clock).
    """

    def __init__(self, memory: _Memory) -> None:
        """Keep the ledger beside ``memory``'s rows (the argument is the class docstring's)."""
        self._m = memory
        self._passes: dict[UUID, _Pass] = {}

    async def begin(self, start: BackfillStart) -> BackfillPass:
        """Open a ``running`` pass, or answer the row ``start.id`` already names unchanged.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty name/checksum.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after the driver closed.
        """
        check_backfill_start(start)
        with self._m.lock:
            now = self._m.now()
            found = self._passes.get(start.id)
            if found is None:
                row = BackfillPass(
                    id=start.id,
                    name=start.name,
                    scope=start.scope,
                    checksum=start.checksum,
                    status="running",
                    app_version=start.app_version,
                    rows=0,
                    last_cursor=None,
                    started_at=now,
                )
                found = self._passes[start.id] = _Pass(row, "null", self._m.next_seq())
            return self._read(found)

    async def record(self, progress: BackfillProgress) -> bool:
        """Store rows and cursor of a pass that is not ``completed`` (it becomes ``running``).

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a cursor that is not JSON.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after the driver closed.
        """
        text = _cursor_text(progress.cursor)
        with self._m.lock:
            self._m.now()
            found = self._passes.get(progress.id)
            if found is None or found.row.status == "completed":
                return False
            found.row = replace(found.row, status="running", rows=progress.rows)
            found.cursor = text
            return True

    async def settle(self, pass_id: UUID, status: BackfillStatus) -> bool:
        """End a pass ``completed`` (stamping ``completed_at``) or mark it ``failed``.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for another status.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after the driver closed.
        """
        if status not in ("completed", "failed"):
            raise DriverRequestInvalidError(f"a pass settles completed or failed, not {status!r}")
        with self._m.lock:
            now = self._m.now()
            found = self._passes.get(pass_id)
            if found is None or found.row.status == "completed":
                return False
            found.row = replace(
                found.row,
                status=status,
                completed_at=now if status == "completed" else None,
            )
            return True

    async def completed(self, name: str, scope: str) -> BackfillPass | None:
        """Answer the newest ``completed`` pass of ``(name, scope)``, or ``None``.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after the driver closed.
        """
        with self._m.lock:
            self._m.now()
            done = [
                p
                for p in self._passes.values()
                if p.row.name == name and p.row.scope == scope and p.row.status == "completed"
            ]
            newest = max(done, key=lambda p: (p.row.started_at, p.seq), default=None)
            return None if newest is None else self._read(newest)

    async def passes(self, query: BackfillQuery) -> list[BackfillPass]:
        """Answer passes matching ``query``, newest ``started_at`` first.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a limit outside 1..1,000.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after the driver closed.
        """
        check_backfill_query(query)
        with self._m.lock:
            self._m.now()
            found = [
                p
                for p in self._passes.values()
                if (query.name is None or p.row.name == query.name)
                and (query.scope is None or p.row.scope == query.scope)
            ]
            found.sort(key=lambda p: (p.row.started_at, p.seq), reverse=True)
            return [self._read(p) for p in found[: query.limit]]

    @staticmethod
    def _read(found: _Pass) -> BackfillPass:
        return replace(found.row, last_cursor=json.loads(found.cursor))
