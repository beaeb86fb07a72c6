"""export_rows(): one part per page, the manifest last, the header in part 0 only, checkpoints of
a cursor and two counters, resumption, the part-size bound, refused rows, NDJSON and the rate."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import time
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest

from ie_helpers import Handled, Item, ListReader, LoggingSink, Org, importer, run_one
from jobs_core import JobRegistry, JobState, Worker
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import JobDeclarationInvalidError
from jobs_import_export import export_rows, memory_sink

ROWS = [{"id": i, "name": f"name {i}", "total": i * 1.5} for i in range(2_345)]


def _exporter(registry: JobRegistry, sink: Any, reader: Any, **options: Any) -> Any:
    options.setdefault("columns", ["id", "name", "total"])
    return export_rows(
        name=options.pop("name", "t.export"),
        input=Org,
        tenant=lambda i: i.org,
        prefix=lambda i: f"exports/{i.org}/e1",
        source=lambda ctx, i: reader,
        sink=lambda: sink,
        registry=registry,
        **options,
    )


async def test_one_part_per_page_then_the_manifest_and_cat_is_one_csv(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    sink = LoggingSink()
    info = await run_one(
        driver, _exporter(registry, sink, ListReader(ROWS), batch=500), Org(), registry
    )
    assert info.state == JobState.DONE, info.last_error
    parts = [f"exports/o1/e1/part-{i:05d}.csv" for i in range(5)]
    assert sink.puts == [*parts, "exports/o1/e1/manifest.json"]  # the manifest last
    bodies = [sink.get(key).decode() for key in parts]
    assert bodies[0].startswith("id,name,total\n")
    assert all(not body.startswith("id,") for body in bodies[1:])  # the header in part 0 only
    assert all(body.endswith("\n") for body in bodies)
    whole = "".join(bodies)  # what `cat part-*` prints
    assert list(csv.DictReader(io.StringIO(whole))) == [
        {"id": str(r["id"]), "name": r["name"], "total": repr(r["total"])} for r in ROWS
    ]
    manifest = json.loads(sink.get("exports/o1/e1/manifest.json"))
    assert manifest == {
        "format": "csv",
        "columns": ["id", "name", "total"],
        "parts": 5,
        "rows": 2_345,
        "bytes": len(whole.encode()),
    }
    assert info.result == {
        "rows": 2_345,
        "parts": 5,
        "bytes": len(whole.encode()),
        "manifest": "exports/o1/e1/manifest.json",
    }


async def test_a_step_checkpoints_the_cursor_and_two_counters_never_the_rows(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    sink = memory_sink()
    info = await run_one(
        driver, _exporter(registry, sink, ListReader(ROWS), batch=1_000), Org(), registry
    )
    pages = [s for s in info.steps if s.name.startswith("part:")]
    assert [s.output for s in pages] == [
        {"cursor": 1_000, "rows": 1_000, "bytes": pages[0].output["bytes"]},
        {"cursor": 2_000, "rows": 2_000, "bytes": pages[1].output["bytes"]},
        {"cursor": None, "rows": 2_345, "bytes": info.result["bytes"]},
    ]
    assert info.steps[-1].name == "manifest"


async def test_a_failed_page_resumes_at_its_cursor_and_writes_each_part_once(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    class FlakyReader(ListReader):
        def __call__(self, cursor: Any, limit: int) -> tuple[list[Any], Any]:
            if cursor == 1_000 and 1_000 not in self.calls:
                self.calls.append(cursor)
                raise ConnectionError("the replica went away")
            return super().__call__(cursor, limit)

    reader = FlakyReader(ROWS)
    sink = LoggingSink()
    info = await run_one(driver, _exporter(registry, sink, reader, batch=500), Org(), registry)
    assert info.state == JobState.DONE, info.last_error
    assert info.attempt == 2
    # Attempt 2 replayed parts 0 and 1 from their checkpoints and read on from cursor 1,000.
    assert reader.calls == [None, 500, 1_000, 1_000, 1_500, 2_000]
    assert sink.puts[:2] == ["exports/o1/e1/part-00000.csv", "exports/o1/e1/part-00001.csv"]
    assert len(sink.puts) == 6
    clean = LoggingSink()
    await run_one(
        driver,
        _exporter(registry, clean, ListReader(ROWS), batch=500, name="t.clean"),
        Org(org="o1"),
        registry,
    )
    for key in clean.keys("exports/"):
        assert clean.get(key) == sink.get(key)


async def test_a_page_that_runs_twice_rewrites_the_same_part(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    class CrashAfterPut(LoggingSink):
        """Puts part 2, then fails as a worker killed before the checkpoint would."""

        def put(self, key: str, data: bytes) -> None:
            super().put(key, data)
            if key.endswith("part-00002.csv") and self.puts.count(key) == 1:
                raise ConnectionError("killed before the checkpoint landed")

    sink = CrashAfterPut()
    info = await run_one(
        driver, _exporter(registry, sink, ListReader(ROWS), batch=500), Org(), registry
    )
    assert info.state == JobState.DONE, info.last_error
    part = "exports/o1/e1/part-00002.csv"
    assert sink.puts.count(part) == 2
    assert sink.puts.count("exports/o1/e1/part-00001.csv") == 1
    assert sink.keys("exports/o1/e1/part-") == [f"exports/o1/e1/part-{i:05d}.csv" for i in range(5)]
    assert json.loads(sink.get("exports/o1/e1/manifest.json"))["rows"] == len(ROWS)


async def test_a_part_over_max_part_bytes_fails_naming_the_batch(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    sink = memory_sink()
    job = _exporter(registry, sink, ListReader(ROWS), batch=1_000, max_part_bytes=4_096)
    info = await run_one(driver, job, Org(), registry)
    assert info.state == JobState.DEAD
    assert info.last_error_code == "X_EXPORT_PART_TOO_LARGE"
    assert "lower batch= (now 1,000 rows a page)" in info.last_error
    assert sink.keys() == []  # nothing was written for it


async def test_a_row_key_not_in_columns_is_refused_without_its_value(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    rows = [{"id": 1, "name": "a", "total": 1, "password": "SECRET"}]
    info = await run_one(
        driver, _exporter(registry, memory_sink(), ListReader(rows)), Org(), registry
    )
    assert info.state == JobState.DEAD
    assert info.last_error_code == "X_EXPORT_ROW_INVALID"
    assert "'password'" in info.last_error
    assert "SECRET" not in info.last_error


async def test_a_value_with_no_csv_form_is_refused_naming_its_column(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    rows = [{"id": 1, "name": {"nested": "SECRET"}, "total": 1}]
    info = await run_one(
        driver, _exporter(registry, memory_sink(), ListReader(rows)), Org(), registry
    )
    assert info.last_error_code == "X_EXPORT_ROW_INVALID"
    assert "column 'name'" in info.last_error and "SECRET" not in info.last_error


async def test_cells_of_every_kind_are_written_and_none_differs_from_empty_text(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    rows = [
        {
            "a": None,
            "b": "",
            "c": True,
            "d": Decimal("-12.50"),
            "e": date(2026, 3, 1),
            "f": datetime(2026, 3, 1, 12, 30, tzinfo=UTC),
            "g": UUID(int=1),
            "h": 'say "hi", twice\nplease',
        }
    ]
    sink = memory_sink()
    job = _exporter(registry, sink, ListReader(rows), columns=list("abcdefgh"))
    info = await run_one(driver, job, Org(), registry)
    assert info.state == JobState.DONE, info.last_error
    assert sink.get("exports/o1/e1/part-00000.csv").decode().splitlines(keepends=True)[1:] == [
        ',"",true,-12.50,2026-03-01,2026-03-01T12:30:00+00:00,'
        '00000000-0000-0000-0000-000000000001,"say ""hi"", twice\n',
        'please"\n',
    ]


async def test_an_ndjson_export_imports_back_to_the_same_rows(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    rows = [
        {"id": i, "name": None if i % 3 == 0 else f"n\n{i}", "total": -i / 4} for i in range(700)
    ]
    sink = memory_sink()
    job = _exporter(registry, sink, ListReader(rows), batch=300, format="ndjson")
    info = await run_one(driver, job, Org(), registry)
    assert info.state == JobState.DONE, info.last_error
    parts = sink.keys("exports/o1/e1/part-")
    assert parts[-1].endswith("part-00002.ndjson")
    sink.put("in.ndjson", b"".join(sink.get(key) for key in parts))
    handled = Handled()
    back = await run_one(
        driver, importer(registry, sink, handled, format="ndjson"), Org(key="in.ndjson"), registry
    )
    assert back.state == JobState.DONE, back.last_error
    assert handled.rows == [Item(**row) for row in rows]


async def test_an_empty_export_writes_part_zero_with_the_header_and_the_manifest(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    sink = LoggingSink()
    info = await run_one(driver, _exporter(registry, sink, ListReader([])), Org(), registry)
    assert info.state == JobState.DONE, info.last_error
    assert sink.puts == ["exports/o1/e1/part-00000.csv", "exports/o1/e1/manifest.json"]
    assert sink.get("exports/o1/e1/part-00000.csv") == b"id,name,total\n"
    assert info.result["rows"] == 0 and info.result["parts"] == 1


async def test_a_reader_that_answers_a_last_empty_page_writes_no_empty_part(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    def reader(cursor: Any, limit: int) -> tuple[list[Any], Any]:
        return (ROWS[:10], "more") if cursor is None else ([], "still more")

    sink = LoggingSink()
    info = await run_one(driver, _exporter(registry, sink, reader), Org(), registry)
    assert sink.puts == ["exports/o1/e1/part-00000.csv", "exports/o1/e1/manifest.json"]
    assert info.result["parts"] == 1 and info.result["rows"] == 10


async def test_an_async_reader_and_a_row_function_are_used(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    async def reader(cursor: Any, limit: int) -> tuple[list[Any], Any]:
        return [(1, "x"), (2, "y")], None

    sink = memory_sink()
    job = _exporter(
        registry, sink, reader, columns=["id", "label"], row=lambda t: {"id": t[0], "label": t[1]}
    )
    info = await run_one(driver, job, Org(), registry)
    assert info.state == JobState.DONE, info.last_error
    assert sink.get("exports/o1/e1/part-00000.csv") == b"id,label\n1,x\n2,y\n"


async def test_rate_spaces_the_pages(driver: MemoryDriver, registry: JobRegistry) -> None:
    started = time.monotonic()
    job = _exporter(registry, memory_sink(), ListReader(ROWS[:40]), batch=10, rate=20)
    info = await run_one(driver, job, Org(), registry)
    assert info.state == JobState.DONE, info.last_error
    # Three waits of 1/20 s between four pages (a lower bound holds however loaded the machine).
    assert time.monotonic() - started >= 3 / 20 * 0.9


async def test_a_drain_ends_the_rate_wait_and_hands_the_run_back_uncounted(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    job = _exporter(registry, memory_sink(), ListReader(ROWS), batch=10, rate=0.001)
    queued = await job.enqueue(Org())
    worker = Worker(driver, registry=registry, poll_interval="5ms", drain_timeout="20s")
    running = asyncio.create_task(worker.run())
    deadline = time.monotonic() + 30
    while True:
        found = await driver.introspect.get(queued.id)
        assert found is not None
        if found.state == JobState.RUNNING:
            break
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # inside part 0's thousand-second wait
    asked = time.monotonic()
    worker.request_drain()
    await asyncio.wait_for(running, 20)
    assert time.monotonic() - asked < 10  # the wait ended on the cancel, not after 1,000 s
    found = await driver.introspect.get(queued.id)
    assert found is not None
    assert found.state == JobState.READY and found.attempt == 0


def test_every_export_declaration_problem_is_named_at_once(registry: JobRegistry) -> None:
    with pytest.raises(JobDeclarationInvalidError) as caught:
        export_rows(
            name="t.bad",
            input=Org,
            tenant=lambda i: i.org,
            prefix="exports",  # type: ignore[arg-type]
            source=lambda ctx, i: ListReader([]),
            columns=[],
            sink=lambda: memory_sink(),
            format="xml",  # type: ignore[arg-type]
            batch=-1,
            max_part_bytes=0,
            rate=0,
            registry=registry,
        )
    text = " | ".join(caught.value.meta["problems"])
    for field in ("prefix", "columns", "format", "batch", "max_part_bytes", "rate"):
        assert field in text, field
