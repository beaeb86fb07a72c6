"""The transactional outbox: enqueues that commit and roll back with the caller's business rows.

Without it, an enqueue followed by a rollback runs a job for rows that never existed, and a commit
followed by a crash loses the job. With an outbox installed (:func:`install_outbox`), a
``JobHandle.enqueue`` inside a transaction *stages* a row on that transaction instead of queueing
it; a :class:`Relay` later publishes committed rows to the driver.

* **The row id is the job id.** :meth:`~jobs_core.job.JobHandle.build_request` allocates the job id
  and the run id before staging, so the enqueue answers the real ids inside the transaction, and
  the relay publishes the staged request with its explicit ``id``. A re-publish after a crash
  therefore meets the row the first publish made (the driver answers it, inserting nothing):
  at-least-once publishing, exactly one job. ``deduped`` is known only at publish, so a staged
  enqueue answers ``deduped=False``, except for an input that repeats an earlier one of the same
  ``enqueue_many`` batch, which is answered with that input's ids.
* **Order.** A relay publishes its claimed batch in ``(staged_at, id)`` order and stops at the
  first failed publish, releasing that row and every later one at once, so a later row never
  overtakes an earlier one within a relay. Two relays each publish their own claimed batch; run
  one relay when a strict order across the whole outbox matters (a second one then only takes
  over rows whose claim lapsed).
* **One mark per batch.** Marking each row as it is published was rejected: it doubles the round
  trips, and the explicit-id publish already makes a crash between publish and mark harmless (the
  rows are re-claimed after the lease and re-published onto the same ids).

The memory store (:class:`MemoryOutboxStore`) is for tests and the demo: its transactions hold only
staged rows. Production stages on the app's database transaction (``jobs_pg``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
from bisect import insort
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal
from uuid import UUID, uuid4

from jobs_core._current import current_driver
from jobs_core._durations import Duration, parse_duration
from jobs_core.clock import SYSTEM_CLOCK, Clock
from jobs_core.driver import JobDriver, OutboxStore
from jobs_core.errors import (
    DriverRequestInvalidError,
    JobOptionsInvalidError,
    OutboxNoTransactionError,
    error_code,
)
from jobs_core.types import ENQUEUE_CHUNK, EnqueueRequest, EnqueueResult, OutboxClaim, OutboxRow

_log = logging.getLogger("jobs.outbox")

OutboxMode = Literal["optional", "required"]
"""``optional``: outside a transaction an enqueue is queued directly. ``required``: it is refused
(``X_OUTBOX_NO_TX``)."""


# --- the memory store ---------------------------------------------------------------------------


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
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = SYSTEM_CLOCK if clock is None else clock
        self._lock = threading.Lock()
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

        Rows held by another unexpired claim are skipped. Each taken row gets this claim's fresh
        token, ``claimed_by``, ``claimed_at`` and a lease until now plus ``req.lease_ms``.

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
        with self._lock:
            now = self._clock.now()
            lease_until = now + timedelta(milliseconds=req.lease_ms)
            for row in self._pending:
                if len(taken) == req.limit:
                    break
                if row.lease_until is not None and row.lease_until > now:
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
    try:
        return json.dumps(req.input, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise DriverRequestInvalidError(
            f"the input of {req.name} is not JSON: {exc}", job=req.name
        ) from None


# --- the facade ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outbox:
    """An installed outbox (answered by :func:`install_outbox`).

    Attributes:
        store: where enqueues inside a transaction stage.
        driver: where its relay publishes.
        mode: ``optional`` or ``required`` (see :data:`OutboxMode`).
    """

    store: OutboxStore
    driver: JobDriver
    mode: OutboxMode

    def relay(self, **options: Any) -> Relay:
        """Answer a :class:`Relay` from this outbox's store to its driver (``options`` as there)."""
        return Relay(self.store, self.driver, **options)


_installed: Outbox | None = None
_context_outbox: ContextVar[Outbox | None] = ContextVar("jobs_outbox", default=None)


def _outbox(store: OutboxStore, driver: JobDriver, mode: OutboxMode) -> Outbox:
    if mode not in ("optional", "required"):
        raise JobOptionsInvalidError(
            f"mode: must be 'optional' or 'required', got {mode!r}", option="mode"
        )
    if not isinstance(store, OutboxStore):
        raise JobOptionsInvalidError(
            f"store: {type(store).__name__} is not an OutboxStore", option="store"
        )
    if not isinstance(driver, JobDriver):
        raise JobOptionsInvalidError(
            f"driver: {type(driver).__name__} is not a JobDriver", option="driver"
        )
    return Outbox(store, driver, mode)


def install_outbox(store: OutboxStore, driver: JobDriver, mode: OutboxMode = "optional") -> Outbox:
    """Route enqueues through ``store`` process-wide.

    From now on an enqueue inside a transaction (the store's ambient one, or ``outbox=tx``) stages
    on it; outside one it is queued directly on the current driver under ``"optional"``, and
    refused under ``"required"``. ``outbox=False`` on an enqueue always queues directly. Run a
    :class:`Relay` (``outbox.relay()`` or ``jobs relay``) to publish committed rows to ``driver``.

    Args:
        store: the outbox store (``jobs_pg``'s, or a :class:`MemoryOutboxStore` in tests).
        driver: the driver the relay publishes to.
        mode: ``"optional"`` (default) or ``"required"``.

    Returns:
        The installed :class:`Outbox`; it replaces any earlier one.

    Raises:
        JobOptionsInvalidError: ``X_JOB_OPTIONS_INVALID`` for another mode, a store that is not
            an ``OutboxStore`` or a driver that is not a ``JobDriver``.
    """
    global _installed
    _installed = _outbox(store, driver, mode)
    return _installed


def uninstall_outbox() -> None:
    """Remove the process-wide outbox: enqueues are queued directly again."""
    global _installed
    _installed = None


@contextmanager
def use_outbox(
    store: OutboxStore, driver: JobDriver, mode: OutboxMode = "optional"
) -> Iterator[Outbox]:
    """Install an outbox for the current context only (tests; tasks created inside inherit it).

    It takes precedence over the process-wide one; arguments and errors as :func:`install_outbox`.
    """
    outbox = _outbox(store, driver, mode)
    token = _context_outbox.set(outbox)
    try:
        yield outbox
    finally:
        _context_outbox.reset(token)


def installed_outbox() -> Outbox | None:
    """Answer the outbox an enqueue made here would use (context first), or ``None``."""
    return _context_outbox.get() or _installed


def _staging_target(outbox: Any) -> tuple[OutboxStore, Any] | None:
    """Answer ``(store, tx)`` an enqueue must stage on, or ``None`` to queue it directly.

    Raises:
        JobOptionsInvalidError: ``X_JOB_OPTIONS_INVALID`` for ``outbox=True`` or a transaction
            given with no outbox installed.
        OutboxNoTransactionError: ``X_OUTBOX_NO_TX`` under ``"required"`` outside a transaction.
    """
    if outbox is False:
        return None
    if outbox is True:
        raise JobOptionsInvalidError(
            "outbox: pass a transaction, False to bypass the outbox, or nothing", option="outbox"
        )
    installed = installed_outbox()
    if installed is None:
        if outbox is None:
            return None
        raise JobOptionsInvalidError(
            "outbox: a transaction was given but no outbox is installed; call "
            "install_outbox(store, driver) first",
            option="outbox",
        )
    tx = outbox if outbox is not None else installed.store.ambient()
    if tx is not None:
        return installed.store, tx
    if installed.mode == "required":
        raise OutboxNoTransactionError(
            "the outbox is installed with mode='required' and this enqueue runs outside a "
            "transaction; enqueue inside one, pass outbox=tx, or outbox=False to bypass it"
        )
    return None


async def submit_one(req: EnqueueRequest, outbox: Any, *, staged_ok: bool) -> EnqueueResult:
    """Stage ``req`` or queue it on the current driver, as :func:`install_outbox` says.

    Args:
        req: a request :meth:`~jobs_core.job.JobHandle.build_request` validated.
        outbox: the handle's ``outbox=`` argument (``None``, a transaction, or ``False``).
        staged_ok: whether the caller accepts a staged answer (``on_conflict="error"`` does not:
            a duplicate is known only at publish).

    Returns:
        The driver's answer, or for a staged request its own ids with ``deduped=False``.

    Raises:
        OutboxNoTransactionError: ``X_OUTBOX_NO_TX``.
        JobOptionsInvalidError: ``X_JOB_OPTIONS_INVALID`` for a bad ``outbox`` or a staged
            enqueue the caller cannot accept.
        DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` for a direct enqueue with no driver.
    """
    target = _staging_target(outbox)
    if target is None:
        return await current_driver().enqueue(req)
    if not staged_ok:
        raise JobOptionsInvalidError(
            "on_conflict: 'error' cannot be honoured inside an outbox transaction (a live "
            "duplicate is known only when the relay publishes); use 'dedupe' or outbox=False",
            option="on_conflict",
        )
    store, tx = target
    await store.stage(req, tx)
    return EnqueueResult(req.id, req.run_id, deduped=False)


async def submit_many(reqs: Sequence[EnqueueRequest], outbox: Any) -> list[EnqueueResult]:
    """Stage ``reqs`` in one ``stage_many`` or queue them with ``enqueue_many``.

    Staged, an input whose ``(name, tenant, key)`` repeats an earlier one of the batch is not
    staged and answers the earlier one's ids with ``deduped=True``, as the driver would answer it.

    Returns:
        One result per request, in input order.

    Raises:
        OutboxNoTransactionError: ``X_OUTBOX_NO_TX``.
        JobOptionsInvalidError: ``X_JOB_OPTIONS_INVALID`` for a bad ``outbox``.
        DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` for a direct enqueue with no driver.
    """
    target = _staging_target(outbox)
    if target is None:
        return await current_driver().enqueue_many(reqs)
    first: dict[tuple[str, str, str], EnqueueRequest] = {}
    staged: list[EnqueueRequest] = []
    results: list[EnqueueResult] = []
    for req in reqs:
        key = (req.name, req.tenant_id or "", req.idempotency_key)
        earlier = first.get(key)
        if earlier is not None:
            results.append(EnqueueResult(earlier.id, earlier.run_id, deduped=True))
            continue
        first[key] = req
        staged.append(req)
        results.append(EnqueueResult(req.id, req.run_id, deduped=False))
    store, tx = target
    await store.stage_many(staged, tx)
    return results


# --- the relay ----------------------------------------------------------------------------------


def _ms(value: Duration, name: str) -> int:
    try:
        return parse_duration(value, field=name)
    except ValueError as exc:
        raise JobOptionsInvalidError(str(exc), option=name) from None


class Relay:
    """Publishes committed outbox rows to a driver.

    A pass claims up to ``batch`` rows under a lease of ``claim_lease``, publishes them one by one
    with ``driver.enqueue`` in ``(staged_at, id)`` order, stops at the first failed publish
    (logging ``jobs.outbox.publish-failed``) and releases that row and the rest at once, then
    marks the published rows with one ``mark_published`` fenced on its claim. A claim lost to
    another relay after the lease lapsed is logged ``jobs.outbox.claim-lost``: that relay
    re-publishes those rows onto the same job ids, so no job is doubled.

    Args:
        store: the outbox store.
        driver: where rows are published.
        batch: rows per pass (1..1,000).
        claim_lease: how long a claim holds before another relay may take its rows (``"30s"``);
            longer than a pass takes, or rows are published twice (harmlessly, onto one job).
        poll_interval: the pause after a pass that found less than a full batch or failed
            (``"1s"``).
        relay_id: the incarnation id claims carry (default ``host:pid:random``).

    Raises:
        JobOptionsInvalidError: ``X_JOB_OPTIONS_INVALID`` for a bad option (named).
    """

    def __init__(
        self,
        store: OutboxStore,
        driver: JobDriver,
        *,
        batch: int = 100,
        claim_lease: Duration = "30s",
        poll_interval: Duration = "1s",
        relay_id: str | None = None,
    ) -> None:
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= ENQUEUE_CHUNK:
            raise JobOptionsInvalidError(
                f"batch: an int from 1 to {ENQUEUE_CHUNK}, got {batch!r}", option="batch"
            )
        if relay_id is not None and (not isinstance(relay_id, str) or not relay_id):
            raise JobOptionsInvalidError("relay_id: non-empty text", option="relay_id")
        self.store = store
        self.driver = driver
        self.batch = batch
        self.claim_lease_ms = _ms(claim_lease, "claim_lease")
        self.poll_interval_ms = _ms(poll_interval, "poll_interval")
        self.id = relay_id or f"{socket.gethostname()}:{os.getpid()}:{uuid4().hex[:12]}"
        self._stopping = False
        self._wake = asyncio.Event()
        self._finished = asyncio.Event()
        self._finished.set()
        # One pass at a time per relay; stop() joins the one in flight by taking it.
        self._pass_lock = asyncio.Lock()

    async def run_once(self) -> int:
        """Run one pass; answer how many rows it published.

        Raises:
            Exception: whatever the store raised (claim, release, mark); rows it still holds are
                re-claimed after the lease lapses and re-published onto the same job ids.
        """
        async with self._pass_lock:
            return await self._pass()

    async def run(self) -> None:
        """Pass until :meth:`stop`: at once after a full batch, else after ``poll_interval``.

        A pass that raises (the store is down) is logged ``jobs.outbox.relay-failed`` and
        retried after ``poll_interval``; it never ends the loop.
        """
        self._finished.clear()
        try:
            while not self._stopping:
                full = False
                try:
                    full = await self.run_once() == self.batch
                except Exception as exc:
                    _log.error(
                        "jobs.outbox.relay-failed",
                        exc_info=True,
                        extra={
                            "event": "jobs.outbox.relay-failed",
                            "relay_id": self.id,
                            "code": error_code(exc),
                        },
                    )
                if full or self._stopping:
                    continue
                with suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll_interval_ms / 1000)
                self._wake.clear()
        finally:
            self._finished.set()

    async def stop(self) -> None:
        """Stop passing; wait for the pass in flight to finish (it is not cancelled)."""
        self._stopping = True
        self._wake.set()
        async with self._pass_lock:
            pass
        await self._finished.wait()

    async def _pass(self) -> int:
        rows = await self.store.claim(OutboxClaim(self.id, self.batch, self.claim_lease_ms))
        if not rows:
            return 0
        # One claim hands every row the same token.
        token = rows[0].token
        published: list[UUID] = []
        for index, row in enumerate(rows):
            try:
                await self.driver.enqueue(row.request)
            except Exception as exc:
                held = [r.request.id for r in rows[index:]]
                _log.warning(
                    "jobs.outbox.publish-failed",
                    extra={
                        "event": "jobs.outbox.publish-failed",
                        "relay_id": self.id,
                        "job": row.request.name,
                        "job_id": str(row.request.id),
                        "code": error_code(exc),
                        "error": str(exc)[:500],
                        "released": len(held),
                    },
                )
                await self.store.release(held, token)
                break
            published.append(row.request.id)
        if published:
            marked = await self.store.mark_published(published, token)
            if marked < len(published):
                _log.warning(
                    "jobs.outbox.claim-lost",
                    extra={
                        "event": "jobs.outbox.claim-lost",
                        "relay_id": self.id,
                        "published": len(published),
                        "marked": marked,
                    },
                )
        return len(published)


__all__ = [
    "MemoryOutboxStore",
    "MemoryTransaction",
    "Outbox",
    "OutboxMode",
    "Relay",
    "install_outbox",
    "installed_outbox",
    "submit_many",
    "submit_one",
    "uninstall_outbox",
    "use_outbox",
]
