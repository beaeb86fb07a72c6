"""The SQL jobs-subject runs: the named blocks of ``sql/subject.sql``.

Blocks are read once per process (``importlib.resources``). The catalog blocks run as they are;
the others are templates whose ``{placeholders}`` :mod:`psycopg.sql` fills with quoted
identifiers and fragments built from the catalog (never a value), so an operator can read
every statement jobs-subject sends in one file, and run one by hand.
"""

from __future__ import annotations

import functools
import re
from importlib.resources import files

from psycopg import sql

_BLOCK = re.compile(r"^-- name: (\w+)[ \t]*$", re.MULTILINE)


@functools.cache
def blocks() -> dict[str, str]:
    """Answer every named block of ``subject.sql`` by name, comment lines left out."""
    text = (files("jobs_subject") / "sql" / "subject.sql").read_text(encoding="utf-8")
    parts = _BLOCK.split(text)
    return {
        name: "\n".join(
            line for line in body.strip().splitlines() if not line.lstrip().startswith("--")
        )
        for name, body in zip(parts[1::2], parts[2::2], strict=True)
    }


def block(name: str) -> sql.SQL:
    """Answer block ``name`` as a :class:`psycopg.sql.SQL` (``KeyError`` for an unknown name)."""
    return sql.SQL(blocks()[name])


def fragment(text: str) -> sql.SQL:
    """Answer a piece of SQL the plan writes from catalog facts (a type name, a keyword)."""
    return sql.SQL(text)


__all__ = ["block", "blocks", "fragment"]
