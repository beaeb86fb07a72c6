"""The worker app of the SIGKILL test: an import from a local folder into a PostgreSQL table.

``handle`` upserts each row and counts, in the same statement, how many times it saw it, so the
test reads "handled twice" from the table itself. With ``IE_KILL_STALL_AFTER=N`` the N-th call
writes ``IE_KILL_MARK`` after its upsert committed and then blocks: the test SIGKILLs the process
there, mid-page, after some of the page's rows were written and before its checkpoint.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from pydantic import BaseModel

from jobs_import_export import ErrorSink, import_rows, local_sink, local_source

FOLDER = os.environ.get("IE_KILL_DIR", "/nonexistent")
DATABASE = os.environ.get("IE_KILL_DB", "")
SCHEMA = os.environ.get("IE_KILL_SCHEMA", "public")
STALL_AFTER = int(os.environ.get("IE_KILL_STALL_AFTER", "0"))
MARK = os.environ.get("IE_KILL_MARK", "")

PAGE_BYTES = 16 * 1024
BATCH = 100


class Upload(BaseModel):
    key: str


class Row(BaseModel):
    id: int
    name: str


_lock = threading.Lock()
_state: dict[str, Any] = {"calls": 0, "conn": None}


def _upsert(rows: list[Row], input: Upload) -> None:
    with _lock:
        if _state["conn"] is None:
            _state["conn"] = psycopg.connect(DATABASE, autocommit=True)
        conn = _state["conn"]
        statement = sql.SQL(
            "INSERT INTO {}.imported (id, name, handled) VALUES (%s, %s, 1) "
            "ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, handled = imported.handled + 1"
        ).format(sql.Identifier(SCHEMA))
        with conn.transaction(), conn.cursor() as cur:
            cur.executemany(statement, [(row.id, row.name) for row in rows])
        _state["calls"] += 1
        calls = _state["calls"]
    if STALL_AFTER and calls == STALL_AFTER:
        Path(MARK).write_text(str(rows[0].id))
        time.sleep(3600)  # the test SIGKILLs the process here


upload = import_rows(
    name="ie.kill.import",
    input=Upload,
    tenant="none",
    source=lambda: local_source(FOLDER),
    key=lambda i: i.key,
    columns=["id", "name"],
    schema=Row,
    handle=_upsert,
    errors=ErrorSink(sink=lambda: local_sink(FOLDER), prefix=lambda i: "errors"),
    batch=BATCH,
    page_bytes=PAGE_BYTES,
    max_record_bytes=1024,
)
