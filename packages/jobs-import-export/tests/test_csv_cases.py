"""The CSV cases of issue 19, each a test: BOM, CRLF, quoted newlines across pages, long records,
header mismatches, files naming no columns, bad UTF-8, empty vs quoted-empty cells, and the
formula guard on export."""

from __future__ import annotations

from typing import Any

import pytest

from ie_helpers import Handled, Item, ListReader, Org, error_lines, importer, run_one
from jobs_core import JobRegistry, JobState
from jobs_core.drivers.memory import MemoryDriver
from jobs_import_export import export_rows, memory_sink, memory_source

BOM = b"\xef\xbb\xbf"


async def _import(
    driver: MemoryDriver, registry: JobRegistry, data: bytes, **options: Any
) -> tuple[Any, Handled, Any]:
    store = memory_source({"in.csv": data})
    handled = Handled()
    job = importer(registry, store, handled, **options)
    info = await run_one(driver, job, Org(), registry)
    return info, handled, store


async def test_a_bom_on_the_first_column_is_stripped(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    info, handled, _ = await _import(driver, registry, BOM + b"id,name,total\n1,a,2\n")
    assert info.state == JobState.DONE, info.last_error
    assert handled.rows == [Item(id=1, name="a", total=2.0)]


async def test_crlf_line_ends_are_read_as_line_ends(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    data = b'id,name,total\r\n1,a,2\r\n2,"b\r\nc",3\r\n3,,4\r\n'
    info, handled, _ = await _import(driver, registry, data)
    assert info.state == JobState.DONE, info.last_error
    # The quoted CRLF is the cell's own text; the others end records.
    assert handled.rows == [
        Item(id=1, name="a", total=2.0),
        Item(id=2, name="b\r\nc", total=3.0),
        Item(id=3, name=None, total=4.0),
    ]
    assert info.result["rows"] == 3


async def test_a_quoted_newline_spanning_a_page_boundary_stays_in_its_row(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    head = b"id,name,total\n" + b"".join(b"%d,x,1\n" % i for i in range(10))
    tricky = b'10,"first half\nsecond half, with ""quotes""\nthird",5\n'
    tail = b"11,y,6\n"
    data = head + tricky + tail
    # A page ends in the middle of the quoted field (after its first newline).
    page_bytes = len(head) + tricky.index(b"second") + 3
    info, handled, _ = await _import(
        driver, registry, data, page_bytes=page_bytes, max_record_bytes=page_bytes - 1
    )
    assert info.state == JobState.DONE, info.last_error
    rows = handled.rows
    assert len(rows) == 12
    assert rows[10] == Item(id=10, name='first half\nsecond half, with "quotes"\nthird', total=5)
    assert rows[11] == Item(id=11, name="y", total=6)
    pages = [s for s in info.steps if s.name.startswith("page:")]
    # The first page stopped before the quoted record and the next one started there.
    assert pages[0].output["offset"] == len(head)
    assert pages[0].output["line"] == 11
    assert len(pages) >= 2


async def test_a_record_longer_than_max_record_bytes_fails_the_run_naming_its_line(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    long_cell = "x" * 300
    data = f"id,name,total\n1,a,1\n2,{long_cell},2\n3,c,3\n".encode()
    info, _, _ = await _import(driver, registry, data, page_bytes=1024, max_record_bytes=100)
    assert info.state == JobState.DEAD
    assert info.last_error_code == "X_IMPORT_RECORD_TOO_LARGE"
    assert "line 3" in info.last_error
    assert long_cell not in info.last_error
    assert info.attempt == 1  # terminal: no retry could read it differently


async def test_a_record_longer_than_the_whole_page_fails_the_run(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    # An unclosed quote joins every later line: no record ends within a page.
    data = b'id,name,total\n1,"never closed,1\n' + b"2,b,2\n" * 200
    info, _, _ = await _import(driver, registry, data, page_bytes=256, max_record_bytes=200)
    assert info.last_error_code == "X_IMPORT_RECORD_TOO_LARGE"
    assert "line 2" in info.last_error


async def test_a_header_with_missing_and_undeclared_columns_names_both_escaped(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    data = "id,Tot\x1b[31mal,\u202eevil\n1,2,3\n".encode()
    info, handled, _ = await _import(driver, registry, data)
    assert info.state == JobState.DEAD
    assert info.last_error_code == "X_IMPORT_HEADER_MISMATCH"
    message = info.last_error
    assert "missing 'name', 'total'" in message  # declared names, whole
    assert "2 undeclared in the file" in message
    assert r"'Tot\x1b[31mal'" in message  # the file's, escaped: no raw escape sequence
    assert r"'\u202eevil'" in message
    assert "\x1b" not in message and "\u202e" not in message
    assert handled.rows == []


async def test_a_header_mismatch_shows_at_most_five_cut_names_and_a_count(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    extra = [f"column_{i}_" + "z" * 100 for i in range(9)]
    data = (",".join(["id", "name", "total", *extra]) + "\n").encode()
    info, _, _ = await _import(driver, registry, data)
    message = info.last_error
    assert "9 undeclared in the file" in message
    assert message.count("column_") == 5
    assert "z" * 41 not in message  # each name cut to 40 characters
    assert "'..." in message


@pytest.mark.parametrize(
    "data",
    [b"", BOM, b"\n\n\r\n\n", BOM + b"\r\n\r\n"],
    ids=["empty", "bom-only", "blank-lines", "bom-and-blank-lines"],
)
async def test_a_file_that_names_no_columns_is_a_header_mismatch(
    driver: MemoryDriver, registry: JobRegistry, data: bytes
) -> None:
    info, handled, _ = await _import(driver, registry, data)
    assert info.state == JobState.DEAD
    assert info.last_error_code == "X_IMPORT_HEADER_MISMATCH"
    assert "names no columns" in info.last_error
    assert "'id', 'name', 'total'" in info.last_error
    assert handled.rows == []


async def test_invalid_utf8_refuses_that_row_only(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    data = b"id,name,total\n1,a,1\n2,caf\xe9,2\n3,c,3\n"
    info, handled, store = await _import(driver, registry, data)
    assert info.state == JobState.DONE, info.last_error
    assert [row.id for row in handled.rows] == [1, 3]
    assert info.result["rejected"] == 1
    assert error_lines(store, info.run_id) == [{"line": 3, "field": None, "code": "encoding"}]


async def test_an_empty_cell_is_none_and_a_quoted_empty_cell_is_the_empty_string(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    data = b'id,name,total\n1,,1\n2,"",2\n3,"say ""hi""",3\n'
    info, handled, _ = await _import(driver, registry, data)
    assert info.state == JobState.DONE, info.last_error
    assert [row.name for row in handled.rows] == [None, "", 'say "hi"']


async def test_header_columns_may_come_in_any_order(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    info, handled, _ = await _import(driver, registry, b"total,id,name\n9,1,a\n")
    assert info.state == JobState.DONE, info.last_error
    assert handled.rows == [Item(id=1, name="a", total=9)]
    assert info.steps[-1].output["header"] == ["total", "id", "name"]


async def test_formula_cells_are_guarded_on_export_and_numbers_stay_numbers(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    rows = [
        {"id": 1, "value": "=1+1"},
        {"id": 2, "value": "+SUM(A1:A2)"},
        {"id": 3, "value": "-2"},  # text: guarded
        {"id": 4, "value": -2},  # a number: untouched
        {"id": 5, "value": "@x"},
        {"id": 6, "value": "\tTAB"},
        {"id": 7, "value": "\rCR"},
        {"id": 8, "value": "\uff1d1+1"},  # a full-width equals sign
        {"id": 9, "value": "plain = text"},
        {"id": 10, "value": -2.5},
    ]
    sink = memory_sink()
    job = export_rows(
        name="t.formulas",
        input=Org,
        tenant=lambda i: i.org,
        prefix=lambda i: "out",
        source=lambda ctx, i: ListReader(rows),
        columns=["id", "value"],
        sink=lambda: sink,
        registry=registry,
    )
    info = await run_one(driver, job, Org(), registry)
    assert info.state == JobState.DONE, info.last_error
    assert sink.get("out/part-00000.csv").decode().split("\n") == [
        "id,value",
        "1,'=1+1",
        "2,'+SUM(A1:A2)",
        "3,'-2",
        "4,-2",
        "5,'@x",
        "6,'\tTAB",
        '7,"\'\rCR"',
        "8,'\uff1d1+1",
        "9,plain = text",
        "10,-2.5",
        "",
    ]
