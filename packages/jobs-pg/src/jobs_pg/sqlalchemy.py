"""SQLAlchemy 2 integration: an enqueue made while a ``Session`` holds a transaction stages on it.

``install(driver)`` installs the driver and its transactional outbox and listens to SQLAlchemy's
session events: while a ``Session`` (or the ``Session`` behind an ``AsyncSession``) holds a
transaction, that transaction is the ambient one of the code that opened it, and an enqueue
there stages an outbox row on the session's own psycopg connection. ``session.commit()``
commits the row with the app's rows (a relay then publishes it); ``session.rollback()`` drops
it. The psycopg dialects (``postgresql+psycopg://``, ``postgresql+psycopg_async://``) are the
only ones served: another dialect's enqueue inside a transaction is refused with
``X_DRIVER_REQUEST_INVALID``, never queued outside it.

The session is made ambient when its transaction is *created* (``after_transaction_create``),
not when it first takes a connection (``after_begin``): a ``session.add(order)`` followed by an
enqueue has not flushed yet, and the enqueue must still join the transaction. The stage asks the
session for its connection (a :class:`~jobs_pg._outbox.DeferredConnection`), which begins it.

Rejected: wrapping ``Session`` in a subclass (every app builds its own session factory, often
through Flask-SQLAlchemy or FastAPI dependencies; events reach them all), and asking callers to
pass ``outbox=session`` each time (the one they forget is the bug).
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from typing import Any

import psycopg
from sqlalchemy import event
from sqlalchemy.engine import Connection as SAConnection
from sqlalchemy.ext.asyncio import async_session
from sqlalchemy.orm import Session, SessionTransaction

from jobs_core import install_driver
from jobs_core.errors import DriverRequestInvalidError
from jobs_core.outbox import Outbox, OutboxMode, install_outbox, uninstall_outbox
from jobs_pg._outbox import Connection, _ambient
from jobs_pg.driver import PostgresDriver

PSYCOPG_DRIVERS = frozenset({"psycopg", "psycopg_async"})
"""The SQLAlchemy dialect drivers whose connections the pg outbox stages on."""

# The sessions holding a transaction in this context, innermost last, with what the ambient
# transaction was before each (restored when it ends).
_open: ContextVar[tuple[tuple[Session, Any], ...]] = ContextVar("jobs_pg_sa_sessions", default=())


class SessionConnection:
    """The ambient transaction of a ``Session``: its psycopg connection, found at stage time.

    Args:
        session: the sync ``Session`` (an ``AsyncSession``'s ``sync_session`` for async code).
    """

    def __init__(self, session: Session) -> None:
        self.session = session

    async def psycopg_connection(self) -> Connection:
        """Answer the session's psycopg connection, beginning its transaction on one if needed.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a dialect other than
                psycopg 3's.
        """
        if not self.session.in_transaction():
            # Never begin a new transaction nobody would commit: the job would vanish with it.
            raise DriverRequestInvalidError(
                "the SQLAlchemy session this enqueue would stage on holds no transaction any "
                "more; enqueue inside `with session.begin():` or before commit"
            )
        dialect = self.session.get_bind().dialect
        if dialect.driver not in PSYCOPG_DRIVERS:
            raise _refusal(f"{dialect.name}+{dialect.driver}")
        proxy = async_session(self.session)
        if proxy is not None:
            connection = await proxy.connection()
            raw = await connection.get_raw_connection()
            return _checked(connection.sync_connection, raw.driver_connection)
        # A sync session: acquiring the connection may dial, so not on the (shared) loop.
        return await asyncio.to_thread(self._sync_connection)

    def _sync_connection(self) -> Connection:
        connection = self.session.connection()
        return _checked(connection, connection.connection.driver_connection)


def _checked(connection: SAConnection | None, raw: Any) -> Connection:
    if isinstance(raw, psycopg.AsyncConnection | psycopg.Connection):
        return raw
    dialect = "unknown"
    if connection is not None:
        dialect = f"{connection.dialect.name}+{connection.dialect.driver}"
    raise _refusal(dialect)


def _refusal(dialect: str) -> DriverRequestInvalidError:
    return DriverRequestInvalidError(
        f"an enqueue inside a SQLAlchemy transaction stages on the session's connection, which "
        f"must be psycopg 3's; this engine uses {dialect}: create it with a "
        "postgresql+psycopg:// (or postgresql+psycopg_async://) URL, or enqueue with "
        "outbox=False to queue outside the transaction",
        dialect=dialect,
    )


def _created(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is not None:
        return  # a savepoint or subtransaction: the root's connection already serves it
    opened = _open.get()
    _open.set((*opened, (session, _ambient.get())))
    _ambient.set(SessionConnection(session))


def _ended(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is not None:
        return
    opened = _open.get()
    for index in range(len(opened) - 1, -1, -1):
        if opened[index][0] is session:
            rest = list(opened[:index] + opened[index + 1 :])
            if index == 0 and rest:
                # The outermost ended first: the next one now carries what came before it.
                rest[0] = (rest[0][0], opened[0][1])
            _open.set(tuple(rest))
            if index == len(opened) - 1:
                # The innermost ended: the one opened before it is ambient again.
                _ambient.set(SessionConnection(rest[-1][0]) if rest else opened[index][1])
            return


_installed_on: list[type[Session]] = []


def install(
    driver: PostgresDriver,
    *,
    mode: OutboxMode = "optional",
    session_class: type[Session] = Session,
) -> Outbox:
    """Install ``driver`` and its outbox, and make every session's transaction ambient.

    Call it once at start-up (it does nothing new the second time for one class). Run a relay
    (``jobsctl relay --app ...`` or ``outbox.relay()``) to publish committed rows.

    Args:
        driver: the pg driver (``open_driver("postgresql://...")``); the outbox lives in its
            schema, in the database the sessions write to.
        mode: ``optional`` (an enqueue outside a transaction is queued directly) or
            ``required`` (refused, ``X_OUTBOX_NO_TX``).
        session_class: the ``Session`` class whose sessions join (default: every ``Session``,
            which includes those behind an ``AsyncSession``).

    Returns:
        The installed outbox (``outbox.relay()`` answers a relay for it).
    """
    install_driver(driver)
    outbox = install_outbox(driver.outbox, driver, mode)
    if session_class not in _installed_on:
        event.listen(session_class, "after_transaction_create", _created)
        event.listen(session_class, "after_transaction_end", _ended)
        _installed_on.append(session_class)
    return outbox


def uninstall() -> None:
    """Stop listening to sessions and remove the outbox and the installed driver."""
    for session_class in _installed_on:
        event.remove(session_class, "after_transaction_create", _created)
        event.remove(session_class, "after_transaction_end", _ended)
    _installed_on.clear()
    _open.set(())
    _ambient.set(None)
    uninstall_outbox()
    install_driver(None)
