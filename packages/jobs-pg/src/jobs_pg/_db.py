"""Connection plumbing shared by the driver and its stores.

:class:`Db` owns the pool (or borrows the app's), renders the statements for the schema, stamps
every statement with the clock parameter and turns connection failures into
``DriverUnavailableError``: a caller never sees a psycopg error for a lost server, and the pool is
told to re-check its idle connections so the next call gets a live one.

A server that refuses writes (SQLSTATE 25006 ``read_only_sql_transaction``, or an "in recovery"
refusal: a demoted primary, a hot standby behind a moved VIP, a read-only window) is an outage
too, not an app error: the refusing connection is closed (never back to the pool as healthy), the
owned pool is drained (every idle connection replaced, every lent one closed when it comes back)
and the caller gets ``X_DRIVER_UNAVAILABLE``. Every connection the driver dials asks for
``target_session_attrs=read-write`` (unless the conninfo names its own), so the re-dial reaches
the primary: after a failover behind a stable DNS name or VIP, or once the window ends.

Every statement runs in autocommit on a pool connection: one statement is one transaction, so a
failure leaves nothing half-written. The few operations that need more than one statement
(lease acquire, a scheduler fire, a large ``enqueue_many``) open an explicit transaction.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from jobs_core.clock import Clock
from jobs_core.errors import DriverRequestInvalidError, DriverUnavailableError, JobsError
from jobs_pg._diagnose import probe, statement_error
from jobs_pg._sql import Statements

_log = logging.getLogger("jobs.pg")

STEPLESS_KEPT = 10_000
"""How many step-less claimed runs :attr:`Db.stepless` remembers (a run whose load never
comes, e.g. a row handed back unrun, is forgotten oldest first)."""

UNAVAILABLE: tuple[type[Exception], ...] = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    PoolTimeout,
    PoolClosed,
)
"""Failures that mean the server cannot be reached (or the connection broke mid-statement)."""

Row = tuple[Any, ...]

READ_ONLY_STATE = "25006"
"""SQLSTATE ``read_only_sql_transaction``: a read-only server (``default_transaction_read_only``)
or a hot standby ("cannot execute ... during recovery")."""

IN_RECOVERY_STATE = "55000"
"""SQLSTATE ``object_not_in_prerequisite_state``, which a standby answers for what needs a
primary (an advisory lock "while recovery is in progress"); only with "recovery" in the text."""

DRAIN_EVERY_S = 1.0
"""The shortest interval (s) between two drains of the owned pool after write refusals."""


def refuses_writes(exc: BaseException) -> bool:
    """Answer whether ``exc`` is a server refusing writes (read-only, or in recovery)."""
    if not isinstance(exc, psycopg.Error):
        return False
    if exc.sqlstate == READ_ONLY_STATE:
        return True
    return exc.sqlstate == IN_RECOVERY_STATE and "recovery" in (exc.diag.message_primary or "")


def refused_value(exc: psycopg.DataError) -> DriverRequestInvalidError:
    """Answer the refusal of a value the server would not take, without the server's text.

    Postgres's message quotes the value (``invalid input syntax for type json`` with the token,
    ``DETAIL`` lines with the text around it); a job's payload must never reach an error, so
    only the error's class and SQLSTATE are kept.
    """
    return DriverRequestInvalidError(
        f"the database refused a value ({type(exc).__name__}, SQLSTATE {exc.sqlstate}); "
        "its message is withheld because it quotes the value",
        sqlstate=exc.sqlstate,
    )


def utc(instant: datetime) -> datetime:
    """Answer an aware instant in UTC (an app's pool may run in another session time zone)."""
    return instant if instant.tzinfo is UTC else instant.astimezone(UTC)


def application_name(conninfo: str, name: str) -> dict[str, str]:
    """Answer ``{"application_name": name}`` unless the app's conninfo already names one.

    Operators find the driver's connections by it in ``pg_stat_activity``.
    """
    if "application_name" in conninfo_to_dict(conninfo):
        return {}
    return {"application_name": name}


def read_write(conninfo: str) -> dict[str, str]:
    """Answer ``{"target_session_attrs": "read-write"}`` unless the conninfo names its own.

    libpq then skips a server that answers read-only (a standby, a demoted primary) and dials the
    next host of a multi-host URL, or fails the dial so the pool tries again later.
    """
    if "target_session_attrs" in conninfo_to_dict(conninfo):
        return {}
    return {"target_session_attrs": "read-write"}


WARM_RUNS = 6
"""How many times a new pool connection runs each hot statement before it is lent.

PostgreSQL plans a prepared statement's first five runs for their parameters and from the sixth
reuses one generic plan when it costs no more (the PREPARE documentation): a cold connection
would spend its first runs planning (~0.3-0.7 ms each here) and its very first one loading the
catalog (~4 ms)."""

WARM_UP: tuple[tuple[str, dict[str, Any]], ...] = (
    ("enqueue", {"rows": "[]"}),
    (
        "claim",
        {"queues": [""], "limit": 0, "lease_ms": 1, "worker": "", "drop": [], "reason": ""},
    ),
    (
        "ack",
        {
            "ids": [UUID(int=0)],
            "workers": [""],
            "claims": [-1],
            "results": ["null"],
            "durations": [0.0],
        },
    ),
)
"""The hot statements (enqueue, claim, ack) with inputs that match no row and change nothing:
no request; a claim of at most 0 rows (of the empty queue name, which is never a queue's); an ack
fenced on claim -1, which no claim ever numbers. Their parameters have the types of real calls,
so psycopg reuses the statements it prepared here."""

WARM_LOCK_TIMEOUT = "100ms"
"""How long a warm-up statement waits for a lock (a non-concurrent ``CREATE INDEX`` on ``jobs``,
say) before the warm-up ends: a new connection is never held up behind one."""


class Db:
    """One schema's statements over one pool.

    Args:
        conninfo: the libpq URL or key/value string (without the driver's own options).
        schema: the schema every statement names.
        pool: an app-owned pool to borrow (not closed by :meth:`close`), or ``None`` to own one.
        min_size: the owned pool's idle connections.
        max_size: the owned pool's most connections.
        timeout: seconds a call waits for a pool connection before ``X_DRIVER_UNAVAILABLE``.
        prepare_threshold: psycopg prepares a statement after this many executions on a
            connection (0: at the first).
        clock: an injected clock for tests (``None``: the database's ``now()``).
    """

    def __init__(
        self,
        conninfo: str,
        schema: str,
        *,
        pool: AsyncConnectionPool[Any] | None,
        min_size: int,
        max_size: int,
        timeout: float,
        prepare_threshold: int | None,
        clock: Clock | None,
    ) -> None:
        self.schema = schema
        self.statements = Statements(schema)
        self.clock = clock
        self.owned = pool is None
        # Without prepared statements (behind a pooler) a warm-up would plan nothing to keep.
        self._warm = prepare_threshold is not None
        self._pool_options: dict[str, Any] = {
            "min_size": min_size,
            "max_size": max_size,
            "timeout": timeout,
            "open": False,
            "configure": self._configure,
            "kwargs": {
                "autocommit": True,
                "prepare_threshold": prepare_threshold,
                **application_name(conninfo, f"jobs-pg:{schema}"),
                **read_write(conninfo),
            },
            "name": f"jobs-pg:{schema}",
        }
        self._conninfo = conninfo
        self.pool: AsyncConnectionPool[Any] = pool or self._new_pool()
        self._opened = not self.owned
        # The first-run probe of an owned pool (see _ready), shared by the callers that wait on it.
        self._probing: asyncio.Future[None] | None = None
        self._closed = False
        # Runs a claim just found without step records (run id -> None, oldest first): the
        # step store answers their first load from here instead of a query.
        self.stepless: OrderedDict[UUID, None] = OrderedDict()
        self._checking: asyncio.Task[None] | None = None
        self._draining: asyncio.Task[None] | None = None
        self._drained_at = float("-inf")

    async def _configure(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Set up a new pool connection: UTC, JIT off, and the hot statements planned.

        Timestamps then come back as UTC datetimes. JIT compiling pays off for long analytic
        scans; a queue statement runs in a millisecond, and a 1,000-row enqueue's custom plan
        crossed ``jit_above_cost``, spending ~280 ms of a 445 ms statement compiling it. The
        :data:`WARM_UP` statements run :data:`WARM_RUNS` times each, here while the pool opens
        or grows, so no caller's statement pays a cold connection's catalog loads and plans. A
        failure that leaves the connection usable (a schema not migrated yet, a lock held longer
        than :data:`WARM_LOCK_TIMEOUT`, the session's ``statement_timeout``, a read-only role)
        only ends the warm-up; with ``prepare_threshold=None`` there is none.

        Raises:
            psycopg.OperationalError: the connection broke (the pool then discards it).
        """
        await conn.execute("SET TIME ZONE 'UTC'")
        await conn.execute("SET jit = off")
        if not self._warm:
            return
        await conn.execute(f"SET lock_timeout = '{WARM_LOCK_TIMEOUT}'")
        try:
            for block, values in WARM_UP:
                for _ in range(WARM_RUNS):
                    await self.rows(block, values, conn)
        except psycopg.Error:
            if conn.broken:
                raise
        # Back to the session's own value (the URL's options, the role's or database's setting).
        await conn.execute("RESET lock_timeout")

    @property
    def conninfo(self) -> str:
        """The libpq URL or key/value string the owned pool dials (it may carry a password)."""
        return self._conninfo

    def remember_stepless(self, run_id: UUID) -> None:
        """Note that a run had no step records when this driver claimed it."""
        self.stepless[run_id] = None
        if len(self.stepless) > STEPLESS_KEPT:
            self.stepless.popitem(last=False)

    def now(self) -> datetime | None:
        """Answer the injected clock's instant, or ``None`` (statements then use ``now()``)."""
        return None if self.clock is None else self.clock.now()

    async def _ready(self) -> AsyncConnectionPool[Any]:
        if self._closed:
            raise DriverUnavailableError("the postgresql driver is closed", driver="postgresql")
        if not self._opened:
            await self._probe()
        if not self._opened:
            # Opened on first use, so a driver built outside an event loop (the entry point)
            # binds its pool to the loop that uses it. The first caller waits for the pool's
            # min_size connections (dialled, set up, warmed) rather than ask for one: a client
            # waiting on an empty pool makes it dial one more, and a dial still under way when
            # a short-lived loop ends (a *_sync call's) is cancelled, which psycopg-pool logs as
            # a failed dial and retries. Callers meanwhile ask the pool as before.
            self._opened = True
            try:
                await self.pool.open(wait=True, timeout=self.pool.timeout)
            except PoolTimeout as exc:
                # The wait closed the pool: the next call probes and opens a new one.
                self.pool = self._new_pool()
                self._opened = False
                self._probing = None
                raise DriverUnavailableError(
                    f"postgresql is unavailable: {exc}", driver="postgresql"
                ) from exc
        return self.pool

    async def _probe(self) -> None:
        """Dial once before the owned pool opens, so a first-run mistake is told at once.

        A database that does not exist or a wrong password raises its ``JobsError`` here
        (:func:`~jobs_pg._diagnose.probe`) instead of after the pool's retries; callers that
        arrive meanwhile wait on the same probe. A failed probe is tried again by the next call.

        Raises:
            JobsError: ``X_DATABASE_NOT_FOUND``, ``X_AUTH_FAILED`` or ``X_PERMISSION_DENIED``.
        """
        if self._probing is None:
            self._probing = asyncio.ensure_future(probe(self._conninfo, self.pool.timeout))
        probing = self._probing
        try:
            await asyncio.shield(probing)
        except JobsError:
            if self._probing is probing:
                self._probing = None
            raise

    def _new_pool(self) -> AsyncConnectionPool[Any]:
        return AsyncConnectionPool(self._conninfo, **self._pool_options)

    def _suspect(self) -> None:
        """Have the pool check its idle connections once (a server restart broke them all)."""
        if self.owned and (self._checking is None or self._checking.done()):
            self._checking = asyncio.get_running_loop().create_task(self._check())

    def _refused(self) -> None:
        """Drain the owned pool after a write refusal (at most once per :data:`DRAIN_EVERY_S`).

        Its other connections reach the same read-only server; a re-dial (read-write) reaches
        the primary, or fails until there is one.
        """
        loop = asyncio.get_running_loop()
        if not self.owned or loop.time() - self._drained_at < DRAIN_EVERY_S:
            return
        self._drained_at = loop.time()
        self._draining = loop.create_task(self._check(drain=True))

    async def _check(self, *, drain: bool = False) -> None:
        try:
            await (self.pool.drain() if drain else self.pool.check())
        except Exception as exc:  # the next call reports the outage; this is housekeeping
            _log.debug(
                "jobs.pg.check-failed", extra={"event": "jobs.pg.check-failed", "error": str(exc)}
            )

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """Lend a pool connection (autocommit) for the block.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached,
                the connection broke, the server refused writes (read-only or in recovery: the
                connection is then closed and the pool drained), or the driver is closed.
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` when the server refused a
                value (out of range, not valid JSON).
            SchemaNotMigratedError: ``X_SCHEMA_NOT_MIGRATED`` when a statement met a table or
                schema that does not exist.
            PermissionDeniedError: ``X_PERMISSION_DENIED`` when the role lacks a privilege; or
                the first-run errors of :meth:`_probe`.
        """
        pool = await self._ready()
        try:
            async with pool.connection() as conn:
                try:
                    yield conn
                except psycopg.Error as exc:
                    if refuses_writes(exc):
                        # Closed, so the pool discards it rather than lend it again.
                        await conn.close()
                    raise
        except psycopg.DataError as exc:
            raise refused_value(exc) from None
        except UNAVAILABLE as exc:
            self._suspect()
            raise DriverUnavailableError(
                f"postgresql is unavailable: {type(exc).__name__}: {exc}", driver="postgresql"
            ) from exc
        except psycopg.Error as exc:
            if refuses_writes(exc):
                self._refused()
                raise DriverUnavailableError(
                    f"postgresql refused a write (SQLSTATE {exc.sqlstate}: "
                    f"{exc.diag.message_primary}): the server is read-only or in recovery; "
                    "the driver re-dials the primary",
                    driver="postgresql",
                    sqlstate=exc.sqlstate,
                ) from exc
            mapped = statement_error(exc, self._conninfo, self.schema)
            if mapped is None:
                raise
            raise mapped from exc

    def params(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Answer ``values`` plus the clock parameter every statement takes."""
        return {"now": self.now(), **values}

    async def rows(
        self,
        block: str,
        values: Mapping[str, Any],
        conn: psycopg.AsyncConnection[Any] | None = None,
        *,
        binary: bool = False,
        prepare: bool | None = None,
    ) -> list[Row]:
        """Run block ``block`` and answer its rows (on ``conn``, else a pool connection).

        ``binary`` asks for the rows in binary format: uuid, timestamptz and jsonb columns load
        faster (the hot per-row statements use it; the values are the same either way).
        ``prepare=False`` plans the statement for these values at every run: a statement whose
        optional filters (``%(f)s IS NULL OR column = %(f)s``) decide which index serves it, as
        the listing's do, would otherwise settle on one generic plan that can use none of them.
        """
        if conn is not None:
            return await self._run(conn, block, values, binary, prepare)
        async with self.connection() as lent:
            return await self._run(lent, block, values, binary, prepare)

    async def _run(
        self,
        conn: psycopg.AsyncConnection[Any],
        block: str,
        values: Mapping[str, Any],
        binary: bool,
        prepare: bool | None = None,
    ) -> list[Row]:
        cur = await conn.execute(
            self.statements[block], self.params(values), binary=binary, prepare=prepare
        )
        # The result's status, not ``cur.description``, which builds a Column object per column
        # at every access (3 µs for the enqueue's four).
        result = cur.pgresult
        if result is None or result.status != pq.ExecStatus.TUPLES_OK:
            return []
        return await cur.fetchall()

    async def row(
        self,
        block: str,
        values: Mapping[str, Any],
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> Row | None:
        """Run block ``block`` and answer its first row, or ``None``."""
        found = await self.rows(block, values, conn)
        return found[0] if found else None

    async def value(
        self,
        block: str,
        values: Mapping[str, Any],
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> Any:
        """Run block ``block`` and answer the first column of its first row (``None`` if none)."""
        found = await self.row(block, values, conn)
        return None if found is None else found[0]

    async def close(self) -> None:
        """Refuse every later call; close the pool if it is owned."""
        self._closed = True
        for task in (self._checking, self._draining):
            if task is not None:
                task.cancel()
        if self.owned and self._opened:
            await self.pool.close()
