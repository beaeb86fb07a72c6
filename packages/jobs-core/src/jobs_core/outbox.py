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
* **Order, across crashes.** A relay publishes its claimed batch in ``(staged_at, id)`` order
  with one ``enqueue_many`` and stops at the first row that fails, releasing it and every later
  one at once. A claim never takes a row staged after one that is still held by an unexpired
  claim of its lane (:meth:`~jobs_core.driver.OutboxStore.claim`): a relay restarted after a
  SIGKILL waits for the dead relay's rows to lapse and publishes them first, where it used to
  skip them and publish later rows ahead (50 rows arrived late in the field, "K:126 after
  K:1000"). By default one relay at a time holds the store's relay lease and a second one only
  takes over when it lapses (``exclusive=True``): global staging order. Relays that should
  publish side by side (``exclusive=False``) keep the order per ``order_key`` (an enqueue
  option; rows without one share one lane): global order needs one relay.
* **One publish and one mark per batch.** Publishing row by row was rejected: a round trip per
  row. Marking each row as it is published was rejected too: the explicit-id publish already
  makes a crash between publish and mark harmless (the rows are re-claimed after the lease and
  re-published onto the same ids).

The memory store (:class:`MemoryOutboxStore`) is for tests and the demo: its transactions hold only
staged rows. Production stages on the app's database transaction (``jobs_pg``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal
from uuid import uuid4

from jobs_core._current import call_driver
from jobs_core._durations import Duration, parse_duration
from jobs_core.driver import (
    JobDriver,
    LeaderLease,
    OutboxStageMany,
    OutboxStore,
    check_request_capabilities,
)
from jobs_core.drivers.memory_outbox import MemoryOutboxStore, MemoryTransaction
from jobs_core.errors import (
    JobOptionsInvalidError,
    OutboxNoTransactionError,
    error_code,
)
from jobs_core.types import ENQUEUE_CHUNK, EnqueueRequest, EnqueueResult, OutboxClaim, OutboxRow

_log = logging.getLogger("jobs.outbox")

OutboxMode = Literal["optional", "required"]
"""``optional``: outside a transaction an enqueue is queued directly. ``required``: it is refused
(``X_OUTBOX_NO_TX``)."""


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
    :class:`Relay` (``outbox.relay()`` or ``jobsctl relay``) to publish committed rows to
    ``driver``.

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


def _checked(driver: JobDriver, reqs: Sequence[EnqueueRequest]) -> JobDriver:
    """Answer ``driver`` once it carries the capabilities every request of ``reqs`` needs."""
    for req in reqs:
        check_request_capabilities(driver, req)
    return driver


def _refuse_staged_flow(req: EnqueueRequest) -> None:
    """Refuse debounce on a staged enqueue: it acts on the queue's waiting row at enqueue time."""
    if req.debounce_ms is not None:
        raise JobOptionsInvalidError(
            "debounce: a staged (outbox) enqueue cannot debounce (it replaces a waiting row when "
            "it is queued, not when the relay publishes); enqueue with outbox=False",
            option="debounce",
        )


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
        return await call_driver(lambda driver: _checked(driver, [req]).enqueue(req))
    _refuse_staged_flow(req)
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
    A store without ``stage_many`` (it is optional) stages them one by one on the transaction.

    Returns:
        One result per request, in input order.

    Raises:
        OutboxNoTransactionError: ``X_OUTBOX_NO_TX``.
        JobOptionsInvalidError: ``X_JOB_OPTIONS_INVALID`` for a bad ``outbox``.
        DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` for a direct enqueue with no driver.
    """
    target = _staging_target(outbox)
    if target is None:
        return await call_driver(lambda driver: _checked(driver, reqs).enqueue_many(reqs))
    for req in reqs:
        _refuse_staged_flow(req)
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
    if isinstance(store, OutboxStageMany):
        await store.stage_many(staged, tx)
    else:
        for req in staged:
            await store.stage(req, tx)
    return results


# --- the relay ----------------------------------------------------------------------------------


def _ms(value: Duration, name: str) -> int:
    try:
        return parse_duration(value, field=name)
    except ValueError as exc:
        raise JobOptionsInvalidError(str(exc), option=name) from None


class Relay:
    """Publishes committed outbox rows to a driver, in staging order, across crashes.

    A pass (with ``exclusive``, only while this relay holds the store's relay lease) claims up
    to ``batch`` rows under a lease of ``claim_lease``, publishes them with ONE
    ``driver.enqueue_many`` in ``(staged_at, id)`` order, and marks them with one
    ``mark_published`` fenced on its claim. A batch the driver refuses is published row by row
    up to the row that fails (logged ``jobs.outbox.publish-failed``), which is released with
    every later row at once. A claim lost to another relay after the lease lapsed is logged
    ``jobs.outbox.claim-lost``: that relay re-publishes those rows onto the same job ids, so no
    job is doubled.

    Args:
        store: the outbox store.
        driver: where rows are published.
        batch: rows per pass (1..1,000).
        claim_lease: how long a claim (and the relay lease) holds before another relay may take
            the rows over (``"30s"``); longer than a pass takes, or rows are published twice
            (harmlessly, onto one job). A relay that dies holds its rows, and its lane, that long.
        poll_interval: the pause after a pass that found less than a full batch or failed
            (``"1s"``); with the relay lease, at most a third of ``claim_lease`` (shorter
            values are used as given, longer ones shortened), so the lease is renewed in time.
        relay_id: the incarnation id claims carry (default ``host:pid:random``).
        exclusive: take the store's relay lease, so one relay publishes at a time and a second
            one takes over when the first's lease lapses: global staging order (default). With
            ``False``, or a store without a relay lease, relays publish side by side and keep
            the order per ``order_key`` only.

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
        exclusive: bool = True,
    ) -> None:
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= ENQUEUE_CHUNK:
            raise JobOptionsInvalidError(
                f"batch: an int from 1 to {ENQUEUE_CHUNK}, got {batch!r}", option="batch"
            )
        if relay_id is not None and (not isinstance(relay_id, str) or not relay_id):
            raise JobOptionsInvalidError("relay_id: non-empty text", option="relay_id")
        if not isinstance(exclusive, bool):
            raise JobOptionsInvalidError("exclusive: True or False", option="exclusive")
        self.store = store
        self.driver = driver
        self.batch = batch
        self.claim_lease_ms = _ms(claim_lease, "claim_lease")
        self.poll_interval_ms = _ms(poll_interval, "poll_interval")
        self.id = relay_id or f"{socket.gethostname()}:{os.getpid()}:{uuid4().hex[:12]}"
        lease = getattr(store, "relay_lease", None)
        self.lease: LeaderLease | None = (
            lease if exclusive and isinstance(lease, LeaderLease) else None
        )
        if self.lease is not None:
            self.poll_interval_ms = max(1, min(self.poll_interval_ms, self.claim_lease_ms // 3))
        self._stopping = False
        self._wake = asyncio.Event()
        self._finished = asyncio.Event()
        self._finished.set()
        # One pass at a time per relay; stop() joins the one in flight by taking it.
        self._pass_lock = asyncio.Lock()

    async def run_once(self) -> int:
        """Run one pass; answer how many rows it published (0 while another relay leads).

        Raises:
            Exception: whatever the store raised (lease, claim, release, mark); rows it still
                holds are re-claimed after the lease lapses and re-published onto the same ids.
        """
        async with self._pass_lock:
            if self.lease is not None and not await self.lease.acquire(
                self.id, self.claim_lease_ms
            ):
                return 0
            return await self._pass()

    async def run(self) -> None:
        """Pass until :meth:`stop`: at once after a full batch, else after ``poll_interval``.

        A pass that raises (the store is down) is logged ``jobs.outbox.relay-failed`` and
        retried after ``poll_interval``; it never ends the loop. The relay lease is released on
        the way out.
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
            await self._release_lease()
            self._finished.set()

    async def stop(self) -> None:
        """Stop passing; wait for the pass in flight to finish (it is not cancelled)."""
        self._stopping = True
        self._wake.set()
        async with self._pass_lock:
            pass
        await self._finished.wait()

    async def _release_lease(self) -> None:
        if self.lease is None:
            return
        try:
            await self.lease.release(self.id)
        except Exception as exc:
            # It lapses on its own after claim_lease; a standby relay takes over then.
            _log.warning(
                "jobs.outbox.lease-release-failed",
                extra={
                    "event": "jobs.outbox.lease-release-failed",
                    "relay_id": self.id,
                    "code": error_code(exc),
                },
            )

    async def _pass(self) -> int:
        rows = await self.store.claim(OutboxClaim(self.id, self.batch, self.claim_lease_ms))
        if not rows:
            return 0
        # One claim hands every row the same token.
        token = rows[0].token
        published = await self._publish(rows)
        if published < len(rows):
            await self.store.release([r.request.id for r in rows[published:]], token)
        if published:
            ids = [row.request.id for row in rows[:published]]
            marked = await self.store.mark_published(ids, token)
            if marked < published:
                _log.warning(
                    "jobs.outbox.claim-lost",
                    extra={
                        "event": "jobs.outbox.claim-lost",
                        "relay_id": self.id,
                        "published": published,
                        "marked": marked,
                    },
                )
        return published

    async def _publish(self, rows: Sequence[OutboxRow]) -> int:
        """Publish ``rows`` in order; answer how many landed (a prefix of ``rows``)."""
        try:
            await self.driver.enqueue_many([row.request for row in rows])
            return len(rows)
        except Exception as exc:
            if len(rows) == 1:
                self._failed(rows[0], exc, len(rows))
                return 0
        # The batch was refused as a whole: find the row that fails, so the rows before it
        # still go and the ones after it wait (never overtaking it).
        for index, row in enumerate(rows):
            try:
                await self.driver.enqueue(row.request)
            except Exception as exc:
                self._failed(row, exc, len(rows) - index)
                return index
        return len(rows)

    def _failed(self, row: OutboxRow, exc: Exception, released: int) -> None:
        _log.warning(
            "jobs.outbox.publish-failed",
            extra={
                "event": "jobs.outbox.publish-failed",
                "relay_id": self.id,
                "job": row.request.name,
                "job_id": str(row.request.id),
                "code": error_code(exc),
                "error": str(exc)[:500],
                "released": released,
            },
        )


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
