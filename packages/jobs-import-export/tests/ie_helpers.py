"""Builders shared by the import/export tests: sources over lists, sinks that log, runs."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from jobs_core import JobHandle, JobInfo, JobRegistry
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.testing import run_jobs
from jobs_import_export import ErrorSink, MemoryStorage, import_rows


class Org(BaseModel):
    """The input of most test jobs: whose data, and which object."""

    org: str = "o1"
    key: str = "in.csv"


class Item(BaseModel):
    """A row schema with a required int, a text that may be empty or absent, and a float."""

    id: int
    name: str | None = None
    total: float = 0.0


class ListReader:
    """A keyset reader over a list (the cursor is the next index); counts its calls."""

    def __init__(self, rows: Sequence[Any]) -> None:
        self.rows = list(rows)
        self.calls: list[Any] = []

    def __call__(self, cursor: Any, limit: int) -> tuple[list[Any], Any]:
        self.calls.append(cursor)
        start = cursor or 0
        page = self.rows[start : start + limit]
        after = start + len(page)
        return page, (after if after < len(self.rows) else None)


@dataclass
class LoggingSink(MemoryStorage):
    """A memory store that records the order of its puts."""

    puts: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        MemoryStorage.__init__(self)
        self._order_lock = threading.Lock()

    def put(self, key: str, data: bytes) -> None:
        MemoryStorage.put(self, key, data)
        with self._order_lock:
            self.puts.append(key)


class Handled:
    """A ``handle`` that keeps every batch it was given (rows as dicts)."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []

    def __call__(self, rows: list[Any], input: Any) -> None:
        self.batches.append(list(rows))

    @property
    def rows(self) -> list[Any]:
        return [row for batch in self.batches for row in batch]


async def run_one(
    driver: MemoryDriver, handle: JobHandle[Any, Any], input: Any, registry: JobRegistry
) -> JobInfo:
    """Enqueue ``input``, run jobs until none is live, answer the row."""
    queued = await handle.enqueue(input)
    await run_jobs(driver, registry=registry, timeout="60s")
    found = await driver.introspect.get(queued.id)
    assert found is not None
    return found


def error_lines(
    store: MemoryStorage, run_id: UUID | str, prefix: str = "errors/o1"
) -> list[dict[str, Any]]:
    """Answer every refusal line a run wrote, in part order."""
    lines = []
    for key in store.keys(f"{prefix}/{run_id}/"):
        lines += [json.loads(line) for line in store.get(key).decode().splitlines()]
    return lines


def importer(
    registry: JobRegistry,
    store: MemoryStorage,
    handle: Any,
    *,
    columns: Sequence[str] = ("id", "name", "total"),
    schema: Any = Item,
    name: str = "t.import",
    **options: Any,
) -> JobHandle[Any, Any]:
    """Declare an import of ``Org.key`` from ``store`` whose refusals go to ``store`` too."""
    return import_rows(
        name=name,
        input=Org,
        tenant=lambda i: i.org,
        source=lambda: store,
        key=lambda i: i.key,
        columns=list(columns),
        schema=schema,
        handle=handle,
        errors=ErrorSink(sink=lambda: store, prefix=lambda i: f"errors/{i.org}"),
        registry=registry,
        **options,
    )
