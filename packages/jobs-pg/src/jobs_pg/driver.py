"""The PostgreSQL driver: the required protocol over psycopg 3 (async) and psycopg-pool.

Statements per job (``95-performance.md``): one ``enqueue`` (a CTE), a share of one ``claim``
(every served queue in one statement, many rows per claim) and a share of one ``ack`` (settles
that arrive while one is in flight go together in the next statement, each row's fence checked
on its own). Counters ride in the settle statements; wake-ups ride in the statements that make
rows due. Database time (``now()``) decides what is due and what lapsed.

Design notes (the alternatives that were rejected):

* **Settle batching without a linger timer.** A lone ack is sent at once; acks that arrive while
  one statement is in flight queue up and go together when it returns (at most
  :data:`ACK_BATCH` per statement). A fixed linger (wait 5 ms to gather acks) was rejected: it
  delays every lone job by the linger, and under load the in-flight statement gathers as well.
* **A claim over every queue in one statement** (a lateral scan per queue, each ``FOR UPDATE
  SKIP LOCKED`` in ``(run_at, seq)`` order) instead of one statement per queue or a single scan
  over ``queue = ANY(...)``: the first costs a round trip per queue, the second sorts every due
  row of the queues on each claim.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit
from uuid import UUID

import psycopg
from psycopg_pool import AsyncConnectionPool

from jobs_core.clock import Clock
from jobs_core.driver import (
    CAPABILITIES,
    StepStore,
    check_enqueue_request,
    check_run_ids,
    run_id_taken,
)
from jobs_core.errors import DriverRequestInvalidError, DriverUnavailableError
from jobs_core.types import (
    ENQUEUE_CHUNK,
    LEASE_LAPSED_FINAL_ATTEMPT,
    BuriedJob,
    ClaimedJob,
    ClaimRequest,
    EnqueueRequest,
    EnqueueResult,
    Fence,
    JobState,
    NackOptions,
    QueueStats,
    Settle,
    nack_state,
)
from jobs_pg._backfills import PgBackfillLedger
from jobs_pg._db import Db, Row, utc
from jobs_pg._diagnose import unready
from jobs_pg._migrate import apply_migrations
from jobs_pg._outbox import PgOutboxStore
from jobs_pg._rate import PgRateStore
from jobs_pg._records import debounce_params, enqueue_params, json_text
from jobs_pg._retention import PgRetentionStore
from jobs_pg._sql import check_schema, wake_channel
from jobs_pg._stores import (
    PgChildJobs,
    PgCounterStore,
    PgEventBus,
    PgIntrospector,
    PgLeaderLease,
    PgLeaseStore,
    PgSchedulerState,
    PgStepStore,
    PgWorkerRegistry,
)
from jobs_pg._wake import PgWakeSource

CAPABILITY_SET = frozenset(
    {
        "introspect",
        "leases",
        "events",
        "wake",
        "outbox",
        "scheduler_state",
        "leader",
        "workers",
        "counters",
        "backfills",
        "retention",
        "priority",
        "debounce",
        "children",
        "rate",
    }
)
"""What the driver carries: every capability."""

ACK_BATCH = 100
"""The most acks one ``ack`` statement settles."""

ENQUEUE_RETRIES = 5
"""How many times an enqueue re-runs for requests that lost a race with a concurrent commit."""

_URL_OPTIONS = ("schema", "min_size", "max_size")


@dataclass(slots=True)
class _PendingAck:
    job_id: UUID
    fence: Fence
    result: str
    duration_ms: float | None
    answer: asyncio.Future[bool] = field(repr=False)


class _AckBatcher:
    """Gathers acks into ``ack`` statements: one in flight, the next gathering meanwhile.

    Bound to the event loop of its first ack; acks from another loop go alone.
    """

    def __init__(self, db: Db) -> None:
        self._db = db
        self._pending: list[_PendingAck] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flusher: asyncio.Task[None] | None = None

    async def ack(self, job_id: UUID, by: Settle, result: str) -> bool:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        pending = _PendingAck(job_id, by.fence, result, by.duration_ms, loop.create_future())
        if loop is not self._loop:
            return job_id in await self._settle([pending])
        self._pending.append(pending)
        if self._flusher is None or self._flusher.done():
            self._flusher = loop.create_task(self._flush())
        return await pending.answer

    async def _flush(self) -> None:
        while self._pending:
            batch: list[_PendingAck] = []
            later: list[_PendingAck] = []
            seen: set[UUID] = set()
            for pending in self._pending:
                # One row twice in a statement would be settled once and answered twice.
                if len(batch) < ACK_BATCH and pending.job_id not in seen:
                    seen.add(pending.job_id)
                    batch.append(pending)
                else:
                    later.append(pending)
            self._pending = later
            try:
                settled = await self._settle(batch)
            except Exception as exc:
                for pending in batch:
                    if not pending.answer.done():
                        pending.answer.set_exception(exc)
                continue
            for pending in batch:
                if not pending.answer.done():
                    pending.answer.set_result(pending.job_id in settled)

    async def _settle(self, batch: Sequence[_PendingAck]) -> set[UUID]:
        rows = await self._db.rows(
            "ack",
            {
                "ids": [p.job_id for p in batch],
                "workers": [p.fence.worker_id for p in batch],
                "claims": [p.fence.claim for p in batch],
                "results": [p.result for p in batch],
                "durations": [p.duration_ms for p in batch],
            },
        )
        return {row[0] for row in rows}


def _chunks(reqs: Sequence[EnqueueRequest]) -> list[Sequence[EnqueueRequest]]:
    """Split requests into ``enqueue`` statements of at most :data:`ENQUEUE_CHUNK`, in order.

    A statement never carries one id twice (its own insert would be mistaken for a dedupe): a
    repeat starts the next statement, which then meets the row the first one made.
    """
    if len(reqs) <= ENQUEUE_CHUNK and len({req.id for req in reqs}) == len(reqs):
        return [reqs]
    chunks: list[Sequence[EnqueueRequest]] = []
    chunk: list[EnqueueRequest] = []
    ids: set[UUID] = set()
    for req in reqs:
        if len(chunk) == ENQUEUE_CHUNK or req.id in ids:
            chunks.append(chunk)
            chunk, ids = [], set()
        chunk.append(req)
        ids.add(req.id)
    chunks.append(chunk)
    return chunks


def _run_id_taken(
    exc: psycopg.errors.UniqueViolation, chunk: Sequence[EnqueueRequest]
) -> Exception:
    """Answer the ``X_JOB_RUN_ID_TAKEN`` the ``enqueue`` statement raised (``run_id_taken()``).

    Any other unique violation is not the statement's to raise: it is answered as it came.
    """
    holder = exc.diag.message_detail
    if exc.diag.constraint_name != "jobs_run" or holder is None:
        return exc
    for req in chunk:
        if str(req.run_id) in (exc.diag.message_primary or ""):
            return run_id_taken(req, holder)
    return exc


def _split_url(url: str) -> tuple[str, dict[str, str]]:
    """Answer the URL without the driver's own query options, and those options."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in _URL_OPTIONS}
    rest = [(k, v) for k, v in query if k not in _URL_OPTIONS]
    return urlunsplit(parts._replace(query=urlencode(rest))), ours


class PostgresDriver:
    """The PostgreSQL :class:`~jobs_core.driver.JobDriver`, with every capability.

    Build it with :meth:`connect` (async, opens the pool) or :func:`open_postgres_driver` (sync,
    the ``jobs.drivers`` entry point: the pool opens on first use). Everything lives under one
    schema; run :meth:`migrate` (or ``jobsctl pg migrate``) before first use.

    Attributes:
        name: ``"postgresql"``.
        capabilities: ``introspect``, ``leases``, ``events``, ``wake``, ``outbox``,
            ``scheduler_state``, ``leader``, ``workers``, ``counters``, ``backfills``,
            ``retention``, ``children``, ``rate``.
        schema: the schema every table lives in.
        steps: the step store (:class:`~jobs_pg._stores.PgStepStore`).
        introspect: the operator surface.
        leases: fleet concurrency slots.
        events: the stored event bus (it wakes waiters).
        wake: LISTEN/NOTIFY wake-ups (one dedicated connection per driver).
        outbox: the transactional outbox store (stages on the caller's connection).
        scheduler_state: cron watermarks and fires.
        leader: the scheduler's leader lease row.
        workers: the worker registry.
        counters: outcome counters in tiers.
        backfills: the backfill ledger (:class:`~jobs_pg._backfills.PgBackfillLedger`).
        retention: deletes settled rows in bounded batches
            (:class:`~jobs_pg._retention.PgRetentionStore`).
        children: a run's child jobs (:class:`~jobs_pg._stores.PgChildJobs`, migration 0011).
        rate: fleet-wide rate buckets, one statement per token
            (:class:`~jobs_pg._rate.PgRateStore`).

    Args:
        url: a libpq URL (``postgresql://user@host:5432/db``) or key/value conninfo.
        schema: the schema (default ``jobs``; 1-48 letters, digits or ``_``).
        pool: an app-owned :class:`psycopg_pool.AsyncConnectionPool` to borrow instead of
            opening one (it is not closed by :meth:`close`; its connections must be autocommit).
        min_size: idle connections of the owned pool.
        max_size: most connections of the owned pool.
        timeout: seconds a call waits for a connection before ``X_DRIVER_UNAVAILABLE``.
        prepare_threshold: executions before psycopg prepares a statement on a connection
            (default 0: every statement is prepared at its first run; ``None`` disables it,
            for a transaction-pooling proxy without prepared-statement support).
        clock: an injected clock for tests; ``None`` (production) lets ``now()`` decide.
        listen_url: where the LISTEN connection dials, when not ``url``: behind a
            transaction-pooling proxy, point it at the server itself (LISTEN needs a session).

    Every method raises ``DriverUnavailableError`` (``X_DRIVER_UNAVAILABLE``) when the server
    cannot be reached, the connection breaks, or after :meth:`close`; nothing is half-written.
    """

    name: str = "postgresql"
    capabilities: frozenset[str] = CAPABILITY_SET

    def __init__(
        self,
        url: str,
        *,
        schema: str = "jobs",
        pool: AsyncConnectionPool[Any] | None = None,
        min_size: int = 2,
        max_size: int = 10,
        timeout: float = 5.0,
        prepare_threshold: int | None = 0,
        clock: Clock | None = None,
        listen_url: str | None = None,
    ) -> None:
        self.schema = check_schema(schema)
        self._config: dict[str, Any] = {
            "url": url,
            "schema": schema,
            "pool": pool,
            "min_size": min_size,
            "max_size": max_size,
            "timeout": timeout,
            "prepare_threshold": prepare_threshold,
            "clock": clock,
            "listen_url": listen_url,
        }
        if min_size < 0 or max_size < max(min_size, 1):
            raise DriverRequestInvalidError(
                f"pool sizes must satisfy 0 <= min_size <= max_size, max_size >= 1; got "
                f"min_size={min_size}, max_size={max_size}"
            )
        self._db = Db(
            url,
            self.schema,
            pool=pool,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout,
            prepare_threshold=prepare_threshold,
            clock=clock,
        )
        self._acks = _AckBatcher(self._db)
        self.steps: StepStore = PgStepStore(self._db)
        self.introspect = PgIntrospector(self._db)
        self.leases = PgLeaseStore(self._db)
        self.events = PgEventBus(self._db)
        self.wake = PgWakeSource(self._db, wake_channel(self.schema), listen_url or url)
        self.outbox = PgOutboxStore(self._db, PgLeaderLease(self._db, name="outbox-relay"))
        self.scheduler_state = PgSchedulerState(self._db, self._enqueue_on)
        self.leader = PgLeaderLease(self._db)
        self.workers = PgWorkerRegistry(self._db)
        self.counters = PgCounterStore(self._db)
        self.backfills = PgBackfillLedger(self._db)
        self.retention = PgRetentionStore(self._db)
        self.children = PgChildJobs(self._db)
        self.rate = PgRateStore(self._db)

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        schema: str = "jobs",
        pool: AsyncConnectionPool[Any] | None = None,
        min_size: int = 2,
        max_size: int = 10,
        timeout: float = 5.0,
        prepare_threshold: int | None = 0,
        clock: Clock | None = None,
        listen_url: str | None = None,
    ) -> PostgresDriver:
        """Build a driver and make sure the server answers (the arguments are the class's).

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when no connection can be made
                within ``timeout``.
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a bad schema or sizes.
        """
        driver = cls(
            url,
            schema=schema,
            pool=pool,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout,
            prepare_threshold=prepare_threshold,
            clock=clock,
            listen_url=listen_url,
        )
        try:
            await driver._db.value("now", {})
        except DriverUnavailableError:
            await driver.close()
            raise
        return driver

    def reopened(self) -> PostgresDriver:
        """Answer a new driver of this one's configuration that shares none of its connections.

        A forked child calls it (through :mod:`jobs_core.portal`) for the installed driver: the
        parent's pool and its sockets stay the parent's, and the copy's pool dials on first use.
        A driver borrowing an app-owned pool answers itself: that pool is the app's to re-open.
        """
        if self._config["pool"] is not None:
            return self
        return PostgresDriver(**self._config)

    @property
    def clock(self) -> Clock | None:
        """The injected clock, if any (the worker then measures time on it too)."""
        return self._db.clock

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """Lend one of the pool's connections for the block, for the app's own statements.

        The connection is in autocommit (wrap several statements in ``conn.transaction()``),
        its session time zone is UTC, and it goes back to the pool when the block ends. This is
        how a package working on the app's tables through the app's driver reaches the
        database (jobs-subject's plans, erases and exports) without a pool of its own.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached,
                the connection broke, or the driver is closed.
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` when the server refused a
                value (out of range, not valid JSON).
        """
        async with self._db.connection() as conn:
            yield conn

    async def migrate(self) -> list[str]:
        """Apply the shipped migrations this schema lacks (safe to call from many pods at once).

        Returns:
            The migration file names applied by this call, in order.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` when an applied migration
                file was edited since.
        """
        async with self._db.connection() as conn:
            return await apply_migrations(conn, self.schema)

    async def preflight(self) -> None:
        """Check, before the first job, that this database and schema can serve at all.

        One statement: every shipped migration is applied, and the role may read and write
        every table of the schema (a worker calls it at start, and so does ``jobsctl`` before a
        worker, scheduler or relay).

        Raises:
            SchemaNotMigratedError: ``X_SCHEMA_NOT_MIGRATED``, naming the ``jobsctl pg migrate``
                command to run.
            PermissionDeniedError: ``X_PERMISSION_DENIED``, naming the tables and the GRANT.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached;
                or the first-run errors of a first connection (``X_DATABASE_NOT_FOUND``,
                ``X_AUTH_FAILED``).
        """
        found = await self._db.row("preflight", {"schema": self.schema})
        problem = unready(found, self._db.conninfo, self.schema)
        if problem is not None:
            raise problem

    async def enqueue(self, req: EnqueueRequest) -> EnqueueResult:
        """Queue one row (the one-element case of :meth:`enqueue_many`).

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` as :meth:`enqueue_many`.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``; nothing was queued.
        """
        return (await self.enqueue_many([req]))[0]

    async def enqueue_many(self, reqs: Sequence[EnqueueRequest]) -> list[EnqueueResult]:
        """Queue many rows, all or none, one ``enqueue`` statement per 1,000.

        A request whose ``id`` names an existing row (live or finished) answers that row with
        ``deduped=True``; else one whose ``(name, tenant_id or '', idempotency_key)`` a live row
        holds (an earlier request of the batch included) answers that row with ``deduped=True``;
        else a row is inserted, due at ``run_at`` or now plus ``delay_ms`` (a past instant is
        now): ``delayed`` when that is ahead, else ``ready``, and its queue is woken.

        Returns:
            One result per request, in input order.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID``, inserting nothing, for an
                empty name, queue or key, ``max_attempts`` below 1, a naive ``run_at``, a due
                instant out of range, or a value Postgres cannot hold (not JSON, a NUL character).
            JobRunIdTakenError: ``X_JOB_RUN_ID_TAKEN``, inserting nothing, for a request that
                would insert a row whose run id another row holds (the unique ``jobs_run``
                index, migration 0005), or two requests sharing a run id.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``; nothing was queued.
        """
        if not reqs:
            return []
        check_run_ids(reqs)
        if any(req.debounce_ms is not None for req in reqs):
            return await self._enqueue_mixed(reqs)
        chunks = _chunks(reqs)
        params = [enqueue_params(chunk) for chunk in chunks]  # validates before any statement
        async with self._db.connection() as conn:
            if len(chunks) == 1:
                return await self._enqueue_chunk(conn, chunks[0], params[0])
            async with conn.transaction():
                return await self._enqueue_chunks(conn, chunks, params)

    async def _enqueue_mixed(self, reqs: Sequence[EnqueueRequest]) -> list[EnqueueResult]:
        """Queue a batch holding debounced requests one by one, in order, in one transaction."""
        for req in reqs:
            check_enqueue_request(req)
        results: list[EnqueueResult] = []
        async with self._db.connection() as conn, conn.transaction():
            for req in reqs:
                if req.debounce_ms is None:
                    results += await self._enqueue_on(conn, [req])
                else:
                    results.append(await self._enqueue_debounced(conn, req))
        return results

    async def _enqueue_debounced(self, conn: Any, req: EnqueueRequest) -> EnqueueResult:
        """Run the ``enqueue_debounce`` upsert for ``req`` (and its retries after a lost race)."""
        params = debounce_params(req)
        for _ in range(ENQUEUE_RETRIES):
            try:
                row = await self._db.row("enqueue_debounce", params, conn)
            except psycopg.errors.UniqueViolation as exc:
                raise _run_id_taken(exc, [req]) from None
            if row is not None:
                return EnqueueResult(row[0], row[1], deduped=not row[2])
        raise DriverUnavailableError(
            "a debounced enqueue kept losing races with concurrent commits; it is safe to repeat",
            driver="postgresql",
        )

    async def _enqueue_on(self, conn: Any, reqs: Sequence[EnqueueRequest]) -> list[EnqueueResult]:
        """Run the ``enqueue`` statement(s) for ``reqs`` on ``conn``; answer in input order."""
        check_run_ids(reqs)
        chunks = _chunks(reqs)
        return await self._enqueue_chunks(conn, chunks, [enqueue_params(c) for c in chunks])

    async def _enqueue_chunks(
        self,
        conn: Any,
        chunks: Sequence[Sequence[EnqueueRequest]],
        params: Sequence[dict[str, str]],
    ) -> list[EnqueueResult]:
        results: list[EnqueueResult] = []
        for chunk, values in zip(chunks, params, strict=True):
            results += await self._enqueue_chunk(conn, chunk, values)
        return results

    async def _enqueue_chunk(
        self, conn: Any, chunk: Sequence[EnqueueRequest], values: dict[str, str]
    ) -> list[EnqueueResult]:
        """Run one ``enqueue`` statement (``values`` are ``chunk``'s parameters) and its retries."""
        results: list[EnqueueResult | None] = [None] * len(chunk)
        todo: Sequence[int] = range(len(chunk))
        for _ in range(ENQUEUE_RETRIES):
            # The statement answers only the requests that inserted nothing, by 1-based position
            # in this run's batch (its summary row has no position).
            try:
                rows = await self._db.rows("enqueue", values, conn)
            except psycopg.errors.UniqueViolation as exc:
                raise _run_id_taken(exc, chunk) from None
            held = {int(row[0]): row for row in rows if row[0] is not None}
            missed: list[int] = []
            for position, index in enumerate(todo, start=1):
                row = held.get(position)
                if row is None:
                    results[index] = EnqueueResult(chunk[index].id, chunk[index].run_id, False)
                elif row[1] is None:
                    missed.append(index)
                else:
                    results[index] = EnqueueResult(row[1], row[2], True)
            if not missed:
                return [result for result in results if result is not None]
            # The holder committed after this statement's snapshot: look again with a new one.
            todo = missed
            values = enqueue_params([chunk[i] for i in missed])
        raise DriverUnavailableError(
            "an enqueue kept losing races with concurrent commits; it is safe to repeat",
            driver="postgresql",
        )

    async def claim(self, req: ClaimRequest) -> list[ClaimedJob]:
        """Lease up to ``req.limit`` claimable rows of ``req.queues`` to ``req.worker_id``.

        One ``claim`` statement: due ``ready``/``delayed``/``suspended`` rows and ``running`` rows
        whose lease lapsed (that attempt is counted), oldest ``(run_at, insertion)`` first across
        the unpaused queues. A lapsed row at its final attempt met before the limit is reached is
        buried: ``dead`` with ``last_error`` ``LEASE_LAPSED_FINAL_ATTEMPT`` (``failed`` when its
        name is in ``req.drop_exhausted``), reported to ``req.on_exhausted`` after the statement.
        When it claims nothing, the queues' wake is re-armed and, if a row became due meanwhile,
        a second statement claims again.

        Returns:
            The claimed rows in ``(priority, run_at, insertion)`` order; ``attempt`` is spent
            attempts + 1.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty queue list, a
                limit below 1, or a visibility timeout out of range.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``; nothing was claimed.
        """
        if not req.queues or req.limit < 1:
            raise DriverRequestInvalidError(
                "a claim needs at least one queue and a limit >= 1",
                queues=list(req.queues),
                limit=req.limit,
            )
        params = {
            "queues": list(req.queues),
            "limit": req.limit,
            "lease_ms": req.visibility_timeout_ms,
            "worker": req.worker_id,
            "drop": sorted(req.drop_exhausted),
            "reason": LEASE_LAPSED_FINAL_ATTEMPT,
        }
        rows = await self._db.rows("claim", params)
        # Claimed nothing: re-arm the wake of the queues this driver heard a NOTIFY for, and look
        # once more if a row became due while that NOTIFY was the last (PgWakeSource.rearm).
        if all(row[13] != JobState.RUNNING for row in rows) and await self.wake.rearm(req.queues):
            rows += await self._db.rows("claim", params)
        claimed: list[ClaimedJob] = []
        buried: list[BuriedJob] = []
        for row in rows:
            if row[13] == JobState.RUNNING:
                claimed.append(_claimed(row, req.worker_id))
                if not row[18]:
                    self._db.remember_stepless(row[1])
            else:
                buried.append(BuriedJob(row[0], row[2], row[3], JobState(row[13]), row[17]))
        if req.on_exhausted is not None:
            for job in buried:
                req.on_exhausted(job)
        return claimed

    async def ack(self, job_id: UUID, by: Settle) -> bool:
        """Settle a row ``done`` with ``by.result``; fenced on ``running`` and ``by.fence``.

        The attempt is counted, the key freed, and ``done`` (with ``by.duration_ms``) added to
        the job's current 1-minute counter bucket, all in the ``ack`` statement; acks arriving
        while one is in flight share the next statement.

        Returns:
            ``True`` when settled; ``False``, changing nothing, when someone else owns the row.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a result that is not JSON.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``; the row is unchanged (its lease
                lapses and it is claimed again).
        """
        return await self._acks.ack(job_id, by, json_text(by.result, "result"))

    async def nack(self, job_id: UUID, opts: NackOptions) -> bool:
        """Settle a row in ``nack_state(opts)``; fenced like :meth:`ack`.

        The attempt is counted when ``opts.count_attempt``, except for a park (``suspended``).
        ``opts.error``, when given, becomes the row's last error. A ``ready``/``delayed``/
        ``suspended`` row is due at now plus ``opts.delay_ms`` and wakes its queue when that is
        within a second; ``dead``/``failed`` frees its key. The counters gain ``retried`` (a
        counted attempt settled ``ready``/``delayed``), ``failed`` or ``dead``.

        Returns:
            ``True`` when settled; ``False``, changing nothing, when someone else owns the row.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a delay out of range.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``; the row is unchanged.
        """
        target = nack_state(opts)
        spent = 1 if opts.count_attempt and target is not JobState.SUSPENDED else 0
        error = opts.error
        settled = await self._db.row(
            "nack",
            {
                "id": job_id,
                "worker": opts.fence.worker_id,
                "claim": opts.fence.claim,
                "state": str(target),
                "spent": spent,
                "has_error": error is not None,
                "error": None if error is None else error.message,
                "error_code": None if error is None else error.code,
                "error_stack": None if error is None else error.stack,
                "delay_ms": max(opts.delay_ms, 0),
            },
        )
        return settled is not None and settled[0] == 1

    async def heartbeat(self, job_id: UUID, fence: Fence, visibility_timeout_ms: int) -> bool:
        """Renew a running row's lease to now plus ``visibility_timeout_ms``; fenced like ack.

        Returns:
            ``True`` when renewed; ``False`` when the row was cancelled, settled or re-claimed.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a timeout out of range.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        renewed = await self._db.row(
            "heartbeat",
            {
                "id": job_id,
                "worker": fence.worker_id,
                "claim": fence.claim,
                "lease_ms": visibility_timeout_ms,
            },
        )
        return renewed is not None

    async def stats(self) -> list[QueueStats]:
        """Answer counts per queue that ever had a row, by effective state, sorted by queue.

        ``ready``/``delayed`` rows count as ready once their ``run_at`` passed, else delayed;
        ``oldest_ready_ms`` is now minus the earliest such ready ``run_at`` (0 if none). This
        scans the jobs table (finished rows included): an operator and metrics read.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        rows = await self._db.rows("stats", {})
        return [
            QueueStats(
                queue=row[0],
                ready=row[1],
                delayed=row[2],
                running=row[3],
                suspended=row[4],
                done=row[5],
                failed=row[6],
                dead=row[7],
                cancelled=row[8],
                oldest_ready_ms=int(row[9]),
            )
            for row in rows
        ]

    async def demand(self) -> dict[str, int]:
        """Answer, per queue that ever had a row, rows running under a live lease plus rows due.

        Due: waiting rows whose ``run_at`` passed and running rows whose lease lapsed; a paused
        queue counts only its live-lease rows. ``jobsctl pg demand-sql`` prints the same count as
        one number for a KEDA ``postgresql`` trigger.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        return {row[0]: int(row[1]) for row in await self._db.rows("demand", {})}

    async def next_due_at(self) -> datetime | None:
        """Answer when the next claim could take a row, for tests that move an injected clock.

        It is the earliest ``run_at`` of a waiting row or lease expiry of a running row, over
        unpaused queues (it may be in the past); ``None`` when there is none.
        ``jobs_core.testing.run_jobs`` jumps its manual clock there when nothing else is due.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        found = await self._db.value("next_due_at", {})
        return None if found is None else utc(found)

    def describe(self) -> dict[str, Any]:
        """Answer ``{"name", "capabilities", "not_applicable", "schema"}`` (lists sorted)."""
        return {
            "name": self.name,
            "capabilities": sorted(self.capabilities),
            "not_applicable": sorted(set(CAPABILITIES) - self.capabilities),
            "schema": self.schema,
        }

    async def close(self) -> None:
        """Stop the wake listener and close the owned pool; later calls are unavailable.

        Closing twice is fine.
        """
        await self.wake.close()
        await self._db.close()


def _claimed(row: Row, worker_id: str) -> ClaimedJob:
    return ClaimedJob(
        id=row[0],
        run_id=row[1],
        name=row[2],
        queue=row[3],
        input=row[4],
        attempt=row[5] + 1,
        max_attempts=row[6],
        claim=row[7],
        worker_id=worker_id,
        tenant_id=row[8],
        idempotency_key=row[9],
        traceparent=row[10],
        enqueued_by=row[11],
        created_at=utc(row[12]),
        parent_run_id=row[17],
    )


def open_postgres_driver(url: str, **options: Any) -> PostgresDriver:
    """Open a driver for ``url`` without an event loop (the ``jobs.drivers`` entry point).

    The pool opens on the first call, on the loop making it. ``schema``, ``min_size`` and
    ``max_size`` may also come in the URL's query (``?schema=app_jobs&max_size=20``; a keyword
    argument wins); the rest of the query goes to libpq.

    Args:
        url: ``postgresql://…`` or ``postgres://…``.
        **options: :class:`PostgresDriver`'s keyword arguments.

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a URL of another scheme, an
            unknown option, or a bad schema or size.
    """
    scheme = urlsplit(url).scheme
    if scheme not in ("postgresql", "postgres"):
        raise DriverRequestInvalidError(
            f"the postgresql driver takes postgresql:// or postgres:// URLs, not {url!r}"
        )
    conninfo, from_url = _split_url(url)
    merged: dict[str, Any] = {}
    for key, value in from_url.items():
        merged[key] = value if key == "schema" else _int_option(key, value)
    merged.update(options)
    unknown = set(merged) - {
        "schema",
        "pool",
        "min_size",
        "max_size",
        "timeout",
        "prepare_threshold",
        "clock",
        "listen_url",
    }
    if unknown:
        raise DriverRequestInvalidError(
            f"unknown postgresql driver options: {', '.join(sorted(unknown))}",
            options=sorted(unknown),
        )
    return PostgresDriver(conninfo, **merged)


def _int_option(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise DriverRequestInvalidError(f"{key}={value!r} must be an integer", option=key) from None
