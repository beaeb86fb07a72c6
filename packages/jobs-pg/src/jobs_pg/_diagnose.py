"""First-run mistakes told with their fix: a failed connection or statement as a ``JobsError``.

A new user's first hour meets the same few mistakes: a database that does not exist, a wrong
password, a role without privileges, a schema never migrated. Each is permanent (a retry fails the
same way), so the driver answers it at once with a code and the command or statement that mends
it, never a psycopg traceback, and never the pool's retries for its whole timeout.

libpq reports a failed connection as text only (psycopg's ``sqlstate`` is ``None`` for it), so
connection failures are matched on the server's message, which is English unless the server's
``lc_messages`` says otherwise; an unmatched one stays ``X_DRIVER_UNAVAILABLE`` with the server's
own words. Failed statements carry their SQLSTATE and are matched on it. Rejected: a probe query
per statement kind (what a missing table costs is one failed statement, already in hand).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobs_core.driver import redact_url
from jobs_core.errors import (
    AuthenticationFailedError,
    DatabaseNotFoundError,
    JobsError,
    PermissionDeniedError,
    SchemaNotMigratedError,
)
from jobs_pg._sql import migrations

NOT_MIGRATED_STATES = frozenset({"42P01", "3F000"})
"""SQLSTATEs of a statement naming a table or schema that does not exist (undefined_table,
invalid_schema_name): the schema was never migrated."""

INSUFFICIENT_PRIVILEGE = "42501"

_NO_DATABASE = re.compile(r'database "([^"]*)" does not exist')
_NO_CONNECT = re.compile(r'permission denied for database "([^"]*)"')
_AUTH = (
    re.compile(r'password authentication failed for user "(?P<user>[^"]*)"'),
    re.compile(r'role "(?P<user>[^"]*)" does not exist'),
    re.compile(r'no pg_hba\.conf entry for host "[^"]*", user "(?P<user>[^"]*)"'),
    re.compile(r"(?P<what>no password supplied)"),
    re.compile(
        r"(?P<what>(?:Ident|Peer|certificate|GSSAPI|SSPI|LDAP|RADIUS) authentication failed)"
    ),
)


def redact(conninfo: str) -> str:
    """Answer ``conninfo`` (a URL or key/value string) with its password masked as ``***``."""
    if "://" in conninfo:
        return redact_url(conninfo)
    params = conninfo_to_dict(conninfo)
    return make_conninfo(conninfo, password="***") if "password" in params else conninfo


def migrate_command(conninfo: str, schema: str) -> str:
    """Answer the ``jobsctl pg migrate`` command line for this database and schema."""
    target = redact(conninfo) if "://" in conninfo else "URL"
    command = f"jobsctl pg migrate --driver {shlex.quote(target)}"
    return command if schema == "jobs" else f"{command} --schema {schema}"


def _where(conninfo: str) -> tuple[str, str, str]:
    """Answer ``(host:port, database, user)`` as libpq would fill them in, for messages."""
    try:
        params: dict[str, Any] = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        params = {}
    host = str(params.get("host") or "localhost")
    port = str(params.get("port") or "5432")
    user = str(params.get("user") or "the current OS user")
    return f"{host}:{port}", str(params.get("dbname") or user), user


def connect_error(exc: psycopg.Error, conninfo: str) -> JobsError | None:
    """Answer the first-run error a failed connection attempt means, or ``None``.

    ``None`` is a failure a retry may mend (the server is down or still starting, the network):
    the caller keeps its usual ``X_DRIVER_UNAVAILABLE`` handling.

    Args:
        exc: what ``psycopg.AsyncConnection.connect`` raised.
        conninfo: what it was given (for the messages; the password is never shown).

    Returns:
        ``DatabaseNotFoundError`` (``X_DATABASE_NOT_FOUND``), ``AuthenticationFailedError``
        (``X_AUTH_FAILED``) or ``PermissionDeniedError`` (``X_PERMISSION_DENIED``), or ``None``.
    """
    text = str(exc)
    server, database, user = _where(conninfo)
    found = _NO_DATABASE.search(text)
    if found:
        return DatabaseNotFoundError(
            f"database {found[1]!r} does not exist on {server}", database=found[1], server=server
        )
    found = _NO_CONNECT.search(text)
    if found:
        return PermissionDeniedError(
            f"role {user!r} may not connect to database {found[1]!r} on {server} (no CONNECT "
            f"privilege); as its owner: GRANT CONNECT ON DATABASE {found[1]} TO {user}",
            database=found[1],
            server=server,
        )
    for pattern in _AUTH:
        found = pattern.search(text)
        if found:
            groups = found.groupdict()
            reason = groups.get("what") or found[0]
            who = groups.get("user") or user
            return AuthenticationFailedError(
                f"{server} refused user {who!r} for database {database!r}: {reason}",
                server=server,
                user=who,
            )
    return None


def statement_error(exc: psycopg.Error, conninfo: str, schema: str) -> JobsError | None:
    """Answer the first-run error a failed statement means, or ``None`` (raise it as it is).

    Args:
        exc: what the statement raised.
        conninfo: the driver's connection string (for the migrate command; password masked).
        schema: the driver's schema.

    Returns:
        ``SchemaNotMigratedError`` (``X_SCHEMA_NOT_MIGRATED``) for a missing table or schema,
        ``PermissionDeniedError`` (``X_PERMISSION_DENIED``) for a privilege the role lacks,
        else ``None``.
    """
    state = exc.sqlstate
    primary = exc.diag.message_primary or str(exc)
    if state in NOT_MIGRATED_STATES:
        return not_migrated(conninfo, schema, primary)
    if state == INSUFFICIENT_PRIVILEGE:
        _, _, user = _where(conninfo)
        return PermissionDeniedError(
            f"role {user!r} was refused working on schema {schema!r}: {primary}",
            schema=schema,
            user=user,
        )
    return None


def not_migrated(conninfo: str, schema: str, why: str) -> SchemaNotMigratedError:
    """Answer the ``X_SCHEMA_NOT_MIGRATED`` error for ``schema``, naming the command to run."""
    return SchemaNotMigratedError(
        f"schema {schema!r} is not migrated ({why}); run: {migrate_command(conninfo, schema)}",
        schema=schema,
    )


def unready(found: tuple[Any, ...] | None, conninfo: str, schema: str) -> JobsError | None:
    """Answer what the ``preflight`` statement's row says is wrong, or ``None``.

    Args:
        found: ``(newest migration applied, current_user, tables lacking a privilege)``.
        conninfo: the driver's connection string (for the migrate command; password masked).
        schema: the driver's schema.

    Returns:
        ``SchemaNotMigratedError`` when a shipped migration is not applied yet,
        ``PermissionDeniedError`` when the role may not read and write every table, else
        ``None``.
    """
    applied, user, lacking = found if found is not None else (None, "", [])
    latest = migrations()[-1]
    if applied is None or applied < latest.version:
        have = "none" if applied is None else f"up to {applied:04d}"
        return not_migrated(
            conninfo, schema, f"migrations applied: {have}; this jobs-pg ships up to {latest.name}"
        )
    if lacking:
        named = ", ".join(f"{schema}.{table}" for table in lacking[:3])
        if len(lacking) > 3:
            named += f" and {len(lacking) - 3} more of its tables"
        return PermissionDeniedError(
            f"role {user!r} lacks SELECT, INSERT, UPDATE or DELETE on {named}; as their owner: "
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {user}",
            schema=schema,
            user=user,
            tables=list(lacking),
        )
    return None


async def probe(conninfo: str, timeout: float) -> None:
    """Dial one connection and close it, to tell a first-run mistake at once.

    A pool retries a failed connection until its timeout, logging each try; a database that does
    not exist or a wrong password would take that long to say so, once per try.

    Raises:
        JobsError: the error :func:`connect_error` maps the failure to. A failure it maps to
            nothing (an outage) returns quietly: the pool's retries are the right answer then.
    """
    try:
        conn = await psycopg.AsyncConnection.connect(
            conninfo, autocommit=True, connect_timeout=max(2, round(timeout))
        )
    except psycopg.OperationalError as exc:
        mapped = connect_error(exc, conninfo)
        if mapped is not None:
            raise mapped from None
        return
    await conn.close()
