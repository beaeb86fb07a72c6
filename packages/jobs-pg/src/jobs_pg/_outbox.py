"""The transactional outbox on Postgres: staged on the app's own connection, relayed from the pool.

The app's business rows and the outbox row commit together because they are written on the same
psycopg connection inside the same transaction; the relay (:class:`jobs_core.outbox.Relay`)
claims committed rows through the driver's pool and publishes them with their explicit ids, so a
re-publish after a crash meets the job the first publish made.

``transaction(conn)`` opens a transaction on the app's connection and makes it *ambient* for the
block: ``OutboxStore.ambient()`` answers it, so ``handle.enqueue(...)`` inside the block stages
there, and an event published inside it (``publish_event``) joins it too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack, ExitStack
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Any, Protocol, runtime_checkable
from uuid import UUID, uuid4

import psycopg

from jobs_core.driver import LeaderLease
from jobs_core.errors import DriverRequestInvalidError, DriverUnavailableError
from jobs_core.portal import add_capture, remove_capture
from jobs_core.types import ENQUEUE_CHUNK, EnqueueRequest, OutboxClaim, OutboxRow
from jobs_pg._db import UNAVAILABLE, Db, Row, refused_value, utc
from jobs_pg._records import request_arrays

Connection = psycopg.AsyncConnection[Any] | psycopg.Connection[Any]
"""The app's psycopg connection, async or sync."""


@runtime_checkable
class DeferredConnection(Protocol):
    """An ambient transaction whose psycopg connection is found when an enqueue stages on it.

    A framework's transaction may not hold a connection yet when it is entered (a SQLAlchemy
    ``Session`` acquires one at its first statement): the integration makes this ambient, and
    the stage asks it for the connection (:mod:`jobs_pg.sqlalchemy`).
    """

    async def psycopg_connection(self) -> Connection:
        """Answer the psycopg connection of the transaction, acquiring it if needed.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` when the transaction's
                connection is not a psycopg 3 one.
        """
        ...


_ambient: ContextVar[Connection | DeferredConnection | None] = ContextVar(
    "jobs_pg_ambient", default=None
)


AmbientProvider = Callable[[], "Connection | None"]
"""Answers the caller's open transaction's connection, or ``None`` (``jobs_pg.django``'s)."""

_providers: list[AmbientProvider] = []


def add_ambient_provider(provider: AmbientProvider) -> None:
    """Consult ``provider`` when no transaction is ambient in this context (once per provider).

    For a framework that keeps its transaction in thread-local state (Django): it runs on the
    caller's thread, directly or before a sync call hops to the portal loop
    (:func:`jobs_core.portal.add_capture`).
    """
    if provider not in _providers:
        _providers.append(provider)
    add_capture(_capture_ambient)


def remove_ambient_provider(provider: AmbientProvider) -> None:
    """Stop consulting ``provider``."""
    if provider in _providers:
        _providers.remove(provider)
    if not _providers:
        remove_capture(_capture_ambient)


def _capture_ambient() -> None:
    if _ambient.get() is None:
        found = ambient_connection()
        if found is not None:
            _ambient.set(found)


def ambient_connection() -> Connection | DeferredConnection | None:
    """Answer the transaction ambient in this context, else a provider's, else ``None``."""
    found = _ambient.get()
    if found is not None:
        return found
    for provider in _providers:
        conn = provider()
        if conn is not None:
            return conn
    return None


class _AmbientTransaction:
    """The context manager :func:`transaction` answers (``with`` for sync, ``async with`` else)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._token: Token[Connection | DeferredConnection | None] | None = None
        self._async = AsyncExitStack()
        self._sync = ExitStack()

    async def __aenter__(self) -> psycopg.AsyncConnection[Any]:
        conn = self._conn
        if not isinstance(conn, psycopg.AsyncConnection):
            raise DriverRequestInvalidError("use `with` (not `async with`) for a sync connection")
        await self._async.enter_async_context(conn.transaction())
        self._token = _ambient.set(conn)
        return conn

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        assert self._token is not None
        _ambient.reset(self._token)
        return bool(await self._async.__aexit__(kind, error, tb))

    def __enter__(self) -> psycopg.Connection[Any]:
        conn = self._conn
        if not isinstance(conn, psycopg.Connection):
            raise DriverRequestInvalidError("use `async with` for an async connection")
        self._sync.enter_context(conn.transaction())
        self._token = _ambient.set(conn)
        return conn

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        assert self._token is not None
        _ambient.reset(self._token)
        return bool(self._sync.__exit__(kind, error, tb))


def transaction(conn: Connection) -> _AmbientTransaction:
    """Open a transaction on the app's connection and make it ambient for the block.

    Inside the block an enqueue (with the outbox installed) stages on ``conn`` and an event
    publish joins ``conn``; both commit or roll back with the app's rows when the block ends.
    Nested use opens a savepoint, as psycopg's ``conn.transaction()`` does::

        async with jobs_pg.transaction(conn):
            await conn.execute("INSERT INTO orders ...")
            await send_receipt.enqueue(Receipt(order_id=42))

    Args:
        conn: a ``psycopg.AsyncConnection`` (use ``async with``) or ``psycopg.Connection``
            (use ``with``).

    Returns:
        The context manager; entering it answers ``conn``.
    """
    return _AmbientTransaction(conn)


def _sync_first_row(conn: psycopg.Connection[Any], query: Any, params: Any) -> Row | None:
    cur = conn.execute(query, params)
    return cur.fetchone() if cur.description is not None else None


async def on_caller_connection(
    db: Db, conn: Connection | DeferredConnection, block: str, values: Mapping[str, Any]
) -> Row | None:
    """Run ``block`` on the app's connection and answer its first row.

    A :class:`DeferredConnection` is asked for its psycopg connection first.

    Raises:
        DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when that connection is broken.
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for something else than a
            psycopg connection, or a value the server refused.
    """
    query = db.statements[block]
    params = db.params(values)
    if isinstance(conn, DeferredConnection):
        conn = await conn.psycopg_connection()
    try:
        if isinstance(conn, psycopg.AsyncConnection):
            cur = await conn.execute(query, params)
            return await cur.fetchone() if cur.description is not None else None
        if isinstance(conn, psycopg.Connection):
            # A sync app's connection (Django's, a SQLAlchemy Session's): a sync caller's
            # enqueue runs on the shared portal loop, which a blocking statement would stall
            # for every other thread, so it runs on a thread of its own.
            return await asyncio.to_thread(_sync_first_row, conn, query, params)
    except psycopg.DataError as exc:
        raise refused_value(exc) from None
    except UNAVAILABLE as exc:
        raise DriverUnavailableError(
            f"the app's connection is unavailable: {exc}", driver="postgresql"
        ) from exc
    raise DriverRequestInvalidError(
        f"the pg outbox stages on a psycopg connection, not {type(conn).__name__}"
    )


CLAIM_LOCK_NAMESPACE = "jobs-pg.outbox"
"""The first key of the advisory lock that serialises outbox claims (the second is the schema)."""


class PgOutboxStore:
    """The :class:`~jobs_core.driver.OutboxStore` over the ``outbox`` table.

    Args:
        db: the driver's connection plumbing (the relay's claims use its pool).
        relay_lease: the lease one relay at a time holds, which ``Relay(exclusive=True)``
            takes (the driver's: the ``outbox-relay`` row of ``scheduler_leader``).

    Attributes:
        relay_lease: as given.
    """

    def __init__(self, db: Db, relay_lease: LeaderLease) -> None:
        self._db = db
        self.relay_lease = relay_lease

    def ambient(self) -> Connection | DeferredConnection | None:
        """Answer the transaction ambient in this context (:func:`ambient_connection`)."""
        return ambient_connection()

    async def stage(self, req: EnqueueRequest, tx: Any) -> None:
        """Write ``req`` into the outbox on the app's connection ``tx`` (in its transaction).

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a request the driver
                refuses, or a ``tx`` that is not a psycopg connection.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when ``tx`` is broken.
        """
        await self.stage_many([req], tx)

    async def stage_many(self, reqs: Sequence[EnqueueRequest], tx: Any) -> None:
        """Stage many requests on ``tx``, one statement per 1,000.

        A ``delay_ms`` becomes an absolute ``run_at`` at staging (the database's now).

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` as :meth:`stage`, staging
                nothing of a request that is refused.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when ``tx`` is broken.
        """
        chunks = [reqs[i : i + ENQUEUE_CHUNK] for i in range(0, len(reqs), ENQUEUE_CHUNK)]
        arrays = [request_arrays(chunk) for chunk in chunks]
        for values in arrays:
            await on_caller_connection(self._db, tx, "outbox_stage", values)

    async def claim(self, req: OutboxClaim) -> list[OutboxRow]:
        """Take up to ``req.limit`` committed, unpublished rows whose claim is free or lapsed.

        A row is not taken while an unpublished row of its lane staged before it is held by an
        unexpired claim. Claims run one at a time (an advisory lock for the transaction, then
        the claim in a statement of its own, so it sees every claim committed before it).

        Returns:
            The rows in ``(staged_at, id)`` order, each carrying this claim's new token.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a limit or lease below 1.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        if req.limit < 1 or req.lease_ms < 1:
            raise DriverRequestInvalidError(
                "an outbox claim needs limit >= 1 and lease_ms >= 1",
                limit=req.limit,
                lease_ms=req.lease_ms,
            )
        token = f"{req.relay_id}:{uuid4().hex}"
        async with self._db.connection() as conn, conn.transaction():
            await self._db.rows(
                "outbox_claim_lock",
                {"namespace": CLAIM_LOCK_NAMESPACE, "key": self._db.schema},
                conn,
            )
            rows = await self._db.rows(
                "outbox_claim",
                {"limit": req.limit, "token": token, "lease_ms": req.lease_ms},
                conn,
            )
        claimed = [
            OutboxRow(
                request=EnqueueRequest(
                    id=row[0],
                    name=row[1],
                    queue=row[2],
                    input=row[3],
                    idempotency_key=row[4],
                    tenant_id=row[5],
                    max_attempts=row[6],
                    run_id=row[7],
                    run_at=utc(row[8]),
                    traceparent=row[9],
                    enqueued_by=row[10],
                    order_key=row[12],
                    priority=row[13],
                ),
                staged_at=utc(row[11]),
                token=token,
            )
            for row in rows
        ]
        claimed.sort(key=lambda row: (row.staged_at, row.request.id))
        return claimed

    async def release(self, ids: Sequence[UUID], token: str) -> None:
        """Give claimed rows back at once (fenced on ``token``).

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        await self._db.rows("outbox_release", {"ids": list(ids), "token": token})

    async def mark_published(self, ids: Sequence[UUID], token: str) -> int:
        """Mark rows published, fenced on ``token``; answer how many were still this claim's.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        return int(await self._db.value("outbox_mark", {"ids": list(ids), "token": token}))
