"""The memory driver's transactional outbox store (``outbox`` capability of ``memory://``).

Staged rows live in the process with a :class:`MemoryTransaction` standing in for the app's
database transaction: rows become visible to a relay only at commit and vanish at rollback. The
facade and the relay are in :mod:`jobs_core.outbox`; this module depends only on the seam.
"""

from __future__ import annotations

import json
import threading
from bisect import insort
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal
from uuid import UUID, uuid4

from jobs_core.clock import SYSTEM_CLOCK, Clock
from jobs_core.driver import check_enqueue_request
from jobs_core.errors import (
    DriverRequestInvalidError,
)
from jobs_core.serialization import json_text_has_surrogate
from jobs_core.types import EnqueueRequest, OutboxClaim, OutboxRow


@dataclass(slots=True, eq=False)
class _Staged:
    """One staged outbox row; the input is JSON text, as a database would hold it."""

    request: EnqueueRequest
    input: str
    staged_at: datetime
    claimed_by: str | None = None
    claimed_at: datetime | None = None
    lease_until: datetime | None = None
    token: str | None = None

    @property
    def order(self) -> tuple[datetime, UUID]:
        return (self.staged_at, self.request.id)


_ambient_tx: ContextVar[MemoryTransaction | None] = ContextVar("jobs_memory_tx", default=None)


class MemoryTransaction:
    """A transaction of a :class:`MemoryOutboxStore`: it holds staged rows until it ends.

    :meth:`commit` makes its rows visible to relays at once (in one step, under the store's lock);
    :meth:`rollback` drops them. Either ends it: staging on an ended transaction is refused.

    Args:
        store: the store it belongs to.

    Attributes:
        store: the store it belongs to.
        state: ``open``, ``committed`` or ``rolled_back``.
    """

    def __init__(self, store: MemoryOutboxStore) -> None:
        self.store = store
        self.state: Literal["open", "committed", "rolled_back"] = "open"
        self._rows: list[_Staged] = []

    @property
    def open(self) -> bool:
        """Whether rows may still be staged on it."""
        return self.state == "open"

    async def commit(self) -> int:
        """End it, making every staged row claimable by relays at once; answer how many.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` when it already ended.
        """
        return self.store._commit(self)

    async def rollback(self) -> int:
        """Drop every staged row; answer how many (no-op once it ended)."""
        return self.store._rollback(self)


class MemoryRelayLease:
    """The relay lease of a :class:`MemoryOutboxStore`: one holder at a time, with an expiry.

    A :class:`~jobs_core.driver.LeaderLease` measured on the store's clock.

    Args:
        clock: the store's clock.
        lock: the store's lock.
    """

    def __init__(self, clock: Clock, lock: threading.Lock) -> None:
        self._clock = clock
        self._lock = lock
        self._holder: str | None = None
        self._until: datetime | None = None

    async def acquire(self, holder: str, ttl_ms: int) -> bool:
        """Take the lease if it is free or lapsed, or renew it for ``holder``.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty holder or
                ``ttl_ms`` below 1.
        """
        if not holder or ttl_ms < 1:
            raise DriverRequestInvalidError(
                "the relay lease needs a non-empty holder and ttl_ms >= 1", ttl_ms=ttl_ms
            )
        with self._lock:
            now = self._clock.now()
            if self._holder not in (None, holder) and self._until is not None and self._until > now:
                return False
            self._holder, self._until = holder, now + timedelta(milliseconds=ttl_ms)
            return True

    async def release(self, holder: str) -> None:
        """Free the lease if ``holder`` holds it."""
        with self._lock:
            if self._holder == holder:
                self._holder = self._until = None

    async def holder(self) -> str | None:
        """Answer the unexpired holder, or ``None``."""
        with self._lock:
            if self._until is None or self._until <= self._clock.now():
                return None
            return self._holder


class MemoryOutboxStore:
    """An in-process :class:`~jobs_core.driver.OutboxStore` for tests and the demo.

    ``async with store.transaction() as tx:`` opens a transaction that is also the ambient one
    (:meth:`ambient`) in this context, commits on a clean exit and rolls back on an exception;
    :meth:`begin` opens one that is not ambient, for an explicit ``enqueue(..., outbox=tx)``. Only
    committed rows are claimed. It is safe to share between threads (one lock, no awaits under it)
    and, like the memory driver, lives only as long as the process.

    Args:
        clock: the clock ``staged_at`` and claim leases read (the driver's, in tests);
            :data:`~jobs_core.clock.SYSTEM_CLOCK` when ``None``.

    Attributes:
        relay_lease: the lease one relay at a time holds (:class:`MemoryRelayLease`).
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = SYSTEM_CLOCK if clock is None else clock
        self._lock = threading.Lock()
        self.relay_lease = MemoryRelayLease(self._clock, self._lock)
        # Committed, unpublished rows, kept in publish order; published rows are dropped.
        self._pending: list[_Staged] = []
        self._by_id: dict[UUID, _Staged] = {}

    def begin(self) -> MemoryTransaction:
        """Open a transaction that is not ambient: pass it as ``outbox=tx`` and end it yourself."""
        return MemoryTransaction(self)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[MemoryTransaction]:
        """Open an ambient transaction for the ``async with`` block.

        Yields:
            The transaction; enqueues in the block stage on it without naming it.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` when a transaction of this
                store is already ambient here (memory transactions do not nest).
        """
        outer = _ambient_tx.get()
        if outer is not None and outer.store is self and outer.open:
            raise DriverRequestInvalidError(
                "a memory outbox transaction is already open here; memory transactions do not nest"
            )
        tx = self.begin()
        token = _ambient_tx.set(tx)
        try:
            yield tx
        except BaseException:
            self._rollback(tx)
            raise
        else:
            if tx.open:
                self._commit(tx)
        finally:
            _ambient_tx.reset(token)

    def ambient(self) -> MemoryTransaction | None:
        """Answer this store's open transaction ambient in this context, or ``None``."""
        tx = _ambient_tx.get()
        return tx if tx is not None and tx.store is self and tx.open else None

    async def stage(self, req: EnqueueRequest, tx: Any) -> None:
        """Stage ``req`` on ``tx``; it becomes claimable when ``tx`` commits.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` when ``tx`` is not an open
                transaction of this store, or the input is not JSON.
        """
        await self.stage_many([req], tx)

    async def stage_many(self, reqs: Sequence[EnqueueRequest], tx: Any) -> None:
        """Stage many requests on ``tx``, all or none, in order.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` as :meth:`stage`.
        """
        if not isinstance(tx, MemoryTransaction) or tx.store is not self:
            raise DriverRequestInvalidError(
                "outbox=: expected a transaction of this MemoryOutboxStore, got "
                f"{type(tx).__name__}"
            )
        # Stored as text, so a caller mutating its input after the enqueue cannot change the row.
        texts = [_json_text(req) for req in reqs]
        with self._lock:
            if not tx.open:
                raise DriverRequestInvalidError(f"the outbox transaction is {tx.state}")
            now = self._clock.now()
            tx._rows.extend(_Staged(req, text, now) for req, text in zip(reqs, texts, strict=True))

    async def claim(self, req: OutboxClaim) -> list[OutboxRow]:
        """Take up to ``req.limit`` committed, unpublished rows whose claim is free or lapsed.

        A row held by an unexpired claim is skipped, and so is every later row of its lane
        (``order_key``; rows without one share a lane), so no row overtakes one still held.
        Each taken row gets this claim's fresh token, ``claimed_by``, ``claimed_at`` and a
        lease until now plus ``req.lease_ms``.

        Returns:
            The rows in ``(staged_at, id)`` order.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty ``relay_id`` or
                a ``limit`` or ``lease_ms`` below 1.
        """
        if not req.relay_id or req.limit < 1 or req.lease_ms < 1:
            raise DriverRequestInvalidError(
                "an outbox claim needs a relay_id, limit >= 1 and lease_ms >= 1",
                relay_id=req.relay_id,
                limit=req.limit,
                lease_ms=req.lease_ms,
            )
        token = uuid4().hex
        taken: list[OutboxRow] = []
        blocked: set[str] = set()
        with self._lock:
            now = self._clock.now()
            lease_until = now + timedelta(milliseconds=req.lease_ms)
            for row in self._pending:
                if len(taken) == req.limit:
                    break
                lane = row.request.order_key or ""
                if lane in blocked:
                    continue
                if row.lease_until is not None and row.lease_until > now:
                    blocked.add(lane)
                    continue
                row.claimed_by, row.claimed_at = req.relay_id, now
                row.lease_until, row.token = lease_until, token
                request = replace(row.request, input=json.loads(row.input))
                taken.append(OutboxRow(request, row.staged_at, token))
        return taken

    async def release(self, ids: Sequence[UUID], token: str) -> None:
        """Free the rows of ``ids`` still held by claim ``token``; they are claimable at once."""
        with self._lock:
            for row in self._held(ids, token):
                row.claimed_by = row.claimed_at = row.lease_until = row.token = None

    async def mark_published(self, ids: Sequence[UUID], token: str) -> int:
        """Mark the rows of ``ids`` published, fenced on ``token``; answer how many were.

        A row whose claim lapsed is still this claim's until another claim takes it.
        """
        with self._lock:
            marked = list(self._held(ids, token))
            for row in marked:
                del self._by_id[row.request.id]
            if marked:
                gone = {id(row) for row in marked}
                self._pending = [row for row in self._pending if id(row) not in gone]
            return len(marked)

    def pending_count(self) -> int:
        """Answer how many committed rows are not yet published (claimed or not)."""
        with self._lock:
            return len(self._pending)

    def _held(self, ids: Sequence[UUID], token: str) -> Iterator[_Staged]:
        seen: set[UUID] = set()
        for row_id in ids:
            row = self._by_id.get(row_id)
            if row is not None and row.token == token and row_id not in seen:
                seen.add(row_id)
                yield row

    def _commit(self, tx: MemoryTransaction) -> int:
        with self._lock:
            if not tx.open:
                raise DriverRequestInvalidError(f"the outbox transaction is already {tx.state}")
            tx.state = "committed"
            for row in tx._rows:
                self._by_id[row.request.id] = row
                insort(self._pending, row, key=lambda r: r.order)
            count = len(tx._rows)
            tx._rows = []
            return count

    def _rollback(self, tx: MemoryTransaction) -> int:
        with self._lock:
            if not tx.open:
                return 0
            tx.state = "rolled_back"
            count = len(tx._rows)
            tx._rows = []
            return count


def _json_text(req: EnqueueRequest) -> str:
    check_enqueue_request(req)
    try:
        text = json.dumps(req.input, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise DriverRequestInvalidError(
            f"the input of {req.name} is not JSON: {exc}", job=req.name
        ) from None
    if json_text_has_surrogate(text):
        raise DriverRequestInvalidError(
            f"the input of {req.name} holds a lone surrogate (U+D800..U+DFFF), which UTF-8 "
            "cannot encode",
            job=req.name,
        )
    return text
