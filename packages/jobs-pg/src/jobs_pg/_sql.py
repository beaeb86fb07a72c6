"""The SQL the driver runs: named blocks of ``queries.sql`` and the versioned migrations.

Blocks are read once per process (``importlib.resources``) and rendered once per schema: the
``{schema}`` placeholder becomes a quoted identifier through :mod:`psycopg.sql` (never string
formatting), ``{now}`` the statement's clock, ``{filter}`` the ``job_filter`` block. A rendered
block is kept as ``bytes`` so psycopg sends (and prepares) the same text every time.

Rejected: one Python constant per statement. An operator debugging a stuck queue reads
``queries.sql`` top to bottom and runs a block by hand; constants scattered over modules hide that.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from importlib.resources import files

from psycopg import sql

from jobs_core.errors import DriverRequestInvalidError

_BLOCK = re.compile(r"^-- name: (\w+)[ \t]*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_(\w+)\.sql$")
_ONLINE = re.compile(r"^-- jobs-pg: online[ \t]*$", re.MULTILINE)
_STATEMENT_END = re.compile(r";[ \t]*$", re.MULTILINE)
_SCHEMA = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,47}")

NOW = "coalesce(%(now)s::timestamptz, now())"
"""What ``{now}`` stands for: the instant a test injected, else the database's ``now()``."""

FRAGMENTS = frozenset({"job_filter"})
"""Blocks that are pieces of other blocks rather than statements."""


def check_schema(schema: str) -> str:
    """Answer ``schema`` if it is a usable schema name.

    Args:
        schema: 1 to 48 characters, a letter or ``_`` then letters, digits or ``_`` (the wake
            channel ``<schema>.wake`` must fit Postgres's 63-byte identifiers).

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for any other name.
    """
    if not isinstance(schema, str) or not _SCHEMA.fullmatch(schema):
        raise DriverRequestInvalidError(
            f"schema {schema!r} must be 1-48 letters, digits or _ and not start with a digit",
            schema=repr(schema),
        )
    return schema


def wake_channel(schema: str) -> str:
    """Answer the NOTIFY channel a schema's statements wake workers on."""
    return f"{schema}.wake"


@functools.cache
def blocks() -> dict[str, str]:
    """Answer every named block of ``queries.sql`` by name (read once per process)."""
    text = (files("jobs_pg") / "sql" / "queries.sql").read_text(encoding="utf-8")
    parts = _BLOCK.split(text)
    # parts = [header, name1, body1, name2, body2, ...]
    return {name: _code(body) for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def _code(body: str) -> str:
    """Answer a block without its comment lines (the file keeps them for the reader).

    psycopg converts a statement's ``%(name)s`` placeholders at every call unless the text is at
    most 4,096 bytes (``MAX_CACHED_STATEMENT_LENGTH``), when it caches the conversion; with its
    comments the enqueue and claim blocks were longer, and the conversion cost ~30 µs a call.
    """
    return "\n".join(
        line for line in body.strip().splitlines() if not line.lstrip().startswith("--")
    )


class Statements:
    """Every statement block rendered for one schema, by block name.

    Args:
        schema: the schema (already checked with :func:`check_schema`).
    """

    def __init__(self, schema: str) -> None:
        raw = blocks()
        ident = sql.Identifier(schema)
        now = sql.SQL(NOW)
        filter_sql = sql.SQL(raw["job_filter"])
        self._rendered: dict[str, bytes] = {
            name: sql.SQL(text).format(schema=ident, now=now, filter=filter_sql).as_bytes(None)
            for name, text in raw.items()
            if name not in FRAGMENTS
        }

    def __getitem__(self, name: str) -> bytes:
        """Answer the rendered text of block ``name`` (``KeyError`` for an unknown name)."""
        return self._rendered[name]

    def names(self) -> frozenset[str]:
        """Answer the names of every statement block."""
        return frozenset(self._rendered)


@dataclass(frozen=True, slots=True)
class Migration:
    """One versioned migration file.

    Attributes:
        version: its number (the file name's leading four digits).
        name: the file name.
        text: its SQL with the ``{schema}`` and ``{channel}`` placeholders.
        checksum: the SHA-256 of ``text``: a shipped file is never edited, so an applied
            migration whose checksum changed is refused.
        online: the file carries the line ``-- jobs-pg: online``: its statements run one at a
            time outside any transaction (``CREATE INDEX CONCURRENTLY``, which a transaction
            block refuses), so enqueues, claims and settles go on while it runs.
    """

    version: int
    name: str
    text: str
    checksum: str
    online: bool = False

    def render(self, schema: str) -> bytes:
        """Answer the SQL for ``schema`` (identifiers quoted by psycopg)."""
        return (
            sql.SQL(self.text)
            .format(schema=sql.Identifier(schema), channel=sql.Literal(wake_channel(schema)))
            .as_bytes(None)
        )

    def statements(self, schema: str) -> list[bytes]:
        """Answer the SQL for ``schema`` cut into its statements, without comment lines.

        Each statement ends with ``;`` at a line's end; an online migration runs them one at a
        time.
        """
        code = _code(self.render(schema).decode("utf-8"))
        return [part.strip().encode("utf-8") for part in _STATEMENT_END.split(code) if part.strip()]


@functools.cache
def migrations() -> tuple[Migration, ...]:
    """Answer the shipped migrations in version order."""
    folder = files("jobs_pg") / "sql" / "migrations"
    found: list[Migration] = []
    for entry in folder.iterdir():
        matched = _MIGRATION.fullmatch(entry.name)
        if matched is None:
            continue
        text = entry.read_text(encoding="utf-8")
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        online = _ONLINE.search(text) is not None
        found.append(Migration(int(matched[1]), entry.name, text, digest, online))
    return tuple(sorted(found, key=lambda m: m.version))
