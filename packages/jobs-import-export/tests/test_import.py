"""import_rows(): pages as steps, batches, refusals and their report, the error budget, NDJSON,
resumption after a failed attempt, declaration errors and the tenant a handle runs under."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from pydantic import BaseModel

from ie_helpers import Handled, Item, Org, error_lines, importer, run_one
from jobs_core import JobRegistry, JobState, current_actor
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import (
    JobDeclarationInvalidError,
    JobDuplicateError,
    TenantRequiredError,
)
from jobs_import_export import ErrorSink, MemoryStorage, import_rows, memory_source


def _csv(rows: int, *, start: int = 0) -> bytes:
    return b"id,name,total\n" + b"".join(
        b"%d,name %d,%d.5\n" % (i, i, i) for i in range(start, start + rows)
    )


class CountingSource(MemoryStorage):
    """A memory source that records every range it was asked for."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        super().__init__(objects)
        self.reads: list[int] = []

    def read_range(self, key: str, start: int, length: int) -> bytes:
        self.reads.append(start)
        return super().read_range(key, start, length)


async def test_each_page_is_a_step_whose_output_is_the_checkpoint(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    data = _csv(3_000)
    store = CountingSource({"in.csv": data})
    handled = Handled()
    job = importer(registry, store, handled, page_bytes=8_192, max_record_bytes=1_024)
    info = await run_one(driver, job, Org(), registry)
    assert info.state == JobState.DONE, info.last_error
    assert info.steps[0].name == "size" and info.steps[0].output == len(data)
    pages = info.steps[1:]
    assert [s.name for s in pages] == [f"page:{i}" for i in range(len(pages))]
    assert len(pages) == len(store.reads) > 5
    offsets = [0] + [s.output["offset"] for s in pages]
    assert store.reads == offsets[:-1]  # each page read from the previous checkpoint
    assert offsets[-1] == len(data)
    for step in pages:
        # The checkpoint: an offset, counters and the header, never the rows.
        assert set(step.output) == {"offset", "line", "rows", "rejected", "error_part", "header"}
        assert step.output["header"] == ["id", "name", "total"]
        assert len(json.dumps(step.output)) < 200
    assert pages[-1].output["line"] == 3_001
    assert [row.id for row in handled.rows] == list(range(3_000))


async def test_handle_gets_batch_records_at_a_time_in_file_order(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    store = memory_source({"in.csv": _csv(1_234)})
    handled = Handled()
    job = importer(registry, store, handled, batch=100)
    info = await run_one(driver, job, Org(), registry)
    assert info.state == JobState.DONE, info.last_error
    assert [len(b) for b in handled.batches] == [100] * 12 + [34]
    assert [row.id for row in handled.rows] == list(range(1_234))


async def test_refused_rows_are_reported_as_line_field_code_and_never_the_value(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    data = (
        b"id,name,total\n"
        b"1,ok,1\n"
        b"SECRET-id,ok,2\n"  # line 3: id is not an int
        b"3,ok\n"  # line 4: a cell short
        b"4,ok,SECRET-total\n"  # line 5: total is not a number
        b'5,"bad"x,5\n'  # line 6: text after a closing quote
    )
    store = memory_source({"in.csv": data})
    handled = Handled()
    info = await run_one(driver, importer(registry, store, handled), Org(), registry)
    assert info.state == JobState.DONE, info.last_error
    assert [row.id for row in handled.rows] == [1]
    assert error_lines(store, info.run_id) == [
        {"line": 3, "field": "id", "code": "int_parsing"},
        {"line": 4, "field": None, "code": "columns"},
        {"line": 5, "field": "total", "code": "float_parsing"},
        {"line": 6, "field": None, "code": "malformed"},
    ]
    for key in store.keys("errors/"):
        assert b"SECRET" not in store.get(key)
    assert info.result == {
        "rows": 1,
        "rejected": 4,
        "parts": 1,
        "bytes": len(data),
        "error_prefix": f"errors/o1/{info.run_id}",
    }


async def test_refusals_go_to_one_error_part_per_page_that_refused_rows(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    lines = [b"id,name,total\n"] + [
        (b"x,bad,1\n" if i % 100 == 7 else b"%d,ok,1\n" % i) for i in range(1_000)
    ]
    store = memory_source({"in.csv": b"".join(lines)})
    info = await run_one(
        driver,
        importer(registry, store, Handled(), page_bytes=2_048, max_record_bytes=100),
        Org(),
        registry,
    )
    assert info.state == JobState.DONE, info.last_error
    parts = store.keys(f"errors/o1/{info.run_id}/")
    assert parts == [f"errors/o1/{info.run_id}/errors-{i:05d}.ndjson" for i in range(len(parts))]
    assert 1 < len(parts) <= 10
    refused = error_lines(store, info.run_id)
    assert [r["line"] for r in refused] == [i + 2 for i in range(1_000) if i % 100 == 7]
    assert info.result["rejected"] == 10


async def test_past_max_row_errors_the_run_fails_with_its_refusals_written(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    rows = [b"%d,ok,1\n" % i if i % 2 else b"bad,ok,1\n" for i in range(40)]
    store = memory_source({"in.csv": b"id,name,total\n" + b"".join(rows)})
    handled = Handled()
    job = importer(registry, store, handled, batch=10, max_row_errors=12)
    info = await run_one(driver, job, Org(), registry)
    assert info.state == JobState.DEAD
    assert info.last_error_code == "X_IMPORT_TOO_MANY_ERRORS"
    assert info.attempt == 1
    assert "15 rows refused, over max_row_errors=12" in info.last_error
    # Batches 1 and 2 (10 rows each, 5 refused each) were handled; batch 3 crossed the budget
    # and was not.
    assert [len(b) for b in handled.batches] == [5, 5]
    assert len(error_lines(store, info.run_id)) == 15


async def test_max_row_errors_zero_stops_at_the_first_bad_batch(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    data = _csv(30) + b"bad,ok,1\n" + _csv(30, start=31)[len(b"id,name,total\n") :]
    store = memory_source({"in.csv": data})
    handled = Handled()
    job = importer(registry, store, handled, batch=10, max_row_errors=0)
    info = await run_one(driver, job, Org(), registry)
    assert info.last_error_code == "X_IMPORT_TOO_MANY_ERRORS"
    assert [len(b) for b in handled.batches] == [10, 10, 10]
    assert error_lines(store, info.run_id) == [{"line": 32, "field": "id", "code": "int_parsing"}]


async def test_ndjson_refuses_undeclared_keys_bad_json_and_non_objects(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    data = (
        b'{"id": 1, "name": "a", "total": 1}\n'
        b'{"id": 2, "name": "b", "sneaky\\u001b[2J": "SECRET"}\n'
        b"{not json SECRET\n"
        b"[1, 2]\n"
        b"\n"
        b'{"id": 5, "total": 2.5}\r\n'
    )
    store = memory_source({"in.ndjson": data})
    handled = Handled()
    job = importer(registry, store, handled, format="ndjson")
    info = await run_one(driver, job, Org(key="in.ndjson"), registry)
    assert info.state == JobState.DONE, info.last_error
    assert handled.rows == [Item(id=1, name="a", total=1), Item(id=5, total=2.5)]
    assert error_lines(store, info.run_id) == [
        {"line": 2, "field": r"'sneaky\x1b[2J'", "code": "undeclared"},
        {"line": 3, "field": None, "code": "json"},
        {"line": 4, "field": None, "code": "not_object"},
    ]


async def test_the_report_is_the_result_and_the_progress(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    data = _csv(500) + b"bad,x,1\n"
    store = memory_source({"in.csv": data})
    job = importer(registry, store, Handled(), page_bytes=4_096, max_record_bytes=512)
    info = await run_one(driver, job, Org(), registry)
    assert info.result == {
        "rows": 500,
        "rejected": 1,
        "parts": len(info.steps) - 1,
        "bytes": len(data),
        "error_prefix": f"errors/o1/{info.run_id}",
    }
    # Progress is written at most once a second (the core's rule): the first page's, here.
    progress = info.progress
    assert progress["total"] == len(data)
    assert 0 < progress["done"] <= len(data)
    assert re.fullmatch(r"\d+ rows, \d+ rejected", progress["note"])


async def test_a_failed_page_resumes_at_its_checkpoint_handling_at_most_that_page_twice(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    data = _csv(2_000)
    store = CountingSource({"in.csv": data})
    seen: list[int] = []
    failed = []

    def handle(rows: list[Item], input: Org) -> None:
        seen.extend(row.id for row in rows)
        if not failed and len(seen) >= 1_000:
            failed.append(len(seen))
            raise ConnectionError("the database went away")

    job = importer(registry, store, handle, batch=50, page_bytes=4_096, max_record_bytes=512)
    info = await run_one(driver, job, Org(), registry)
    assert info.state == JobState.DONE, info.last_error
    assert info.attempt == 2
    assert sorted(set(seen)) == list(range(2_000))
    twice = [i for i in set(seen) if seen.count(i) > 1]
    page_rows = max(
        s.output["rows"] - p.output["rows"]
        for p, s in zip(info.steps[1:], info.steps[2:], strict=False)
    )
    assert 0 < len(twice) <= page_rows
    # Pages checkpointed before the failure were not read again; the failed one was.
    assert len(store.reads) == len(set(store.reads)) + 1


async def test_a_missing_object_is_terminal(driver: MemoryDriver, registry: JobRegistry) -> None:
    job = importer(registry, memory_source({}), Handled())
    info = await run_one(driver, job, Org(key="nothing/here.csv"), registry)
    assert info.state == JobState.DEAD
    assert info.last_error_code == "X_STORAGE_NOT_FOUND"
    assert info.attempt == 1


async def test_a_key_that_climbs_out_of_its_root_is_refused(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    job = importer(registry, memory_source({}), Handled())
    info = await run_one(driver, job, Org(key="../../etc/passwd"), registry)
    assert info.last_error_code == "X_STORAGE_KEY_INVALID"


async def test_an_object_that_shrinks_under_the_import_is_refused(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    class Shrinking(MemoryStorage):
        def read_range(self, key: str, start: int, length: int) -> bytes:
            self.put(key, self.get(key)[: start + 10])  # someone overwrote it meanwhile
            return super().read_range(key, start, length)

    store = Shrinking({"in.csv": _csv(100)})
    info = await run_one(driver, importer(registry, store, Handled()), Org(), registry)
    assert info.last_error_code == "X_IMPORT_SOURCE_CHANGED"


async def test_an_async_handle_is_awaited_on_the_loop(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    seen: list[int] = []

    async def handle(rows: list[Item], input: Org) -> None:
        seen.extend(row.id for row in rows)

    store = memory_source({"in.csv": _csv(10)})
    info = await run_one(driver, importer(registry, store, handle), Org(), registry)
    assert info.state == JobState.DONE, info.last_error
    assert seen == list(range(10))


@pytest.mark.parametrize("tenant", ["function", "none"])
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_handle_runs_as_the_jobs_tenant_and_none_gets_no_org(
    driver: MemoryDriver, registry: JobRegistry, tenant: str, kind: str
) -> None:
    orgs: list[Any] = []

    def note(rows: list[Item], input: Org) -> None:
        actor = current_actor()
        orgs.append(None if actor is None else actor.org_id)

    async def note_async(rows: list[Item], input: Org) -> None:
        note(rows, input)

    store = memory_source({"in.csv": _csv(3)})
    job = import_rows(
        name=f"t.tenant.{tenant}",
        input=Org,
        tenant=(lambda i: i.org) if tenant == "function" else "none",
        source=lambda: store,
        key=lambda i: i.key,
        columns=["id", "name", "total"],
        schema=Item,
        handle=note if kind == "sync" else note_async,
        errors=ErrorSink(sink=lambda: store, prefix=lambda i: "errors"),
        registry=registry,
    )
    info = await run_one(driver, job, Org(org="acme"), registry)
    assert info.state == JobState.DONE, info.last_error
    assert orgs == (["acme"] if tenant == "function" else [None])


def test_every_declaration_problem_is_named_at_once(registry: JobRegistry) -> None:
    with pytest.raises(JobDeclarationInvalidError) as caught:
        import_rows(
            name="t.bad",
            input=Org,
            tenant=lambda i: i.org,
            source=lambda: memory_source({}),
            key=lambda i: i.key,
            columns=["id", "id"],
            schema=Item,
            handle="not a function",  # type: ignore[arg-type]
            errors=ErrorSink(sink=lambda: memory_source({}), prefix=lambda i: "e"),
            format="xlsx",  # type: ignore[arg-type]
            batch=0,
            page_bytes=1_000,
            max_record_bytes=1_000,
            max_row_errors=-1,
            registry=registry,
            retry="often",  # type: ignore[arg-type]
        )
    problems = caught.value.meta["problems"]
    text = " | ".join(problems)
    for field in ("retry", "columns", "format", "handle", "batch", "max_row_errors", "page_bytes"):
        assert field in text, field
    assert registry.get("t.bad") is None


def test_a_missing_tenant_is_the_cores_error_with_the_factorys_problems(
    registry: JobRegistry,
) -> None:
    with pytest.raises(TenantRequiredError) as caught:
        import_rows(
            name="t.notenant",
            input=Org,
            tenant=None,  # type: ignore[arg-type]
            source=lambda: memory_source({}),
            key=lambda i: i.key,
            columns=["id"],
            schema=Item,
            handle=lambda rows, i: None,
            errors="nowhere",  # type: ignore[arg-type]
            registry=registry,
        )
    text = " | ".join(caught.value.meta["problems"])
    assert "tenant" in text and "errors" in text


def test_a_schema_whose_required_fields_are_not_columns_is_refused(registry: JobRegistry) -> None:
    class Needs(BaseModel):
        id: int
        sku: str

    with pytest.raises(JobDeclarationInvalidError, match="sku"):
        importer(registry, memory_source({}), Handled(), columns=["id"], schema=Needs)


def test_two_declarations_of_one_name_collide(registry: JobRegistry) -> None:
    importer(registry, memory_source({}), Handled(), name="t.twice")
    with pytest.raises(JobDuplicateError):
        import_rows(
            name="t.twice",
            input=Org,
            tenant="none",
            source=lambda: memory_source({}),
            key=lambda i: i.key,
            columns=["id"],
            schema=Item,
            handle=lambda rows, i: None,
            errors=ErrorSink(sink=lambda: memory_source({}), prefix=lambda i: "e"),
            registry=registry,
        )
