"""Property tests (hypothesis) of the pure parts: record boundaries on bytes, the three ways a
CSV record is split agreeing, and export -> import being the identity (formula guard aside)
whatever the page size, line ends or BOM."""

from __future__ import annotations

import asyncio
import csv
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ie_helpers import Handled, ListReader, Org, importer, run_one
from jobs_core import JobRegistry, JobState, use_driver
from jobs_core.drivers.memory import MemoryDriver
from jobs_import_export import FORMULA_TRIGGERS, export_rows, memory_sink
from jobs_import_export._csv import csv_cell, split_records, split_strict
from jobs_import_export._records import complete_length

ALPHABET = st.sampled_from(["a", "b", ",", '"', "\n", "\r", " ", "é", "=", "-", "\t", "@"])
CELL = st.one_of(st.none(), st.text(ALPHABET, max_size=8))
COLUMNS = ["c0", "c1", "c2"]
TABLE = st.lists(st.lists(CELL, min_size=3, max_size=3), max_size=25)
SLOW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _guarded(cell: str | None) -> str | None:
    return "'" + cell if cell and cell[0] in FORMULA_TRIGGERS else cell


def _record(cells: list[str | None]) -> str:
    return ",".join(csv_cell(cell) for cell in cells)


@given(TABLE)
def test_every_split_of_a_written_record_answers_its_cells(table: list[list[str | None]]) -> None:
    records = [_record(cells) for cells in table]
    expected = [[_guarded(cell) for cell in cells] for cells in table]
    assert split_records(records) == expected
    assert [split_strict(record) for record in records] == expected


@given(st.lists(st.text(st.sampled_from(["a", ",", '"', "\r", " "]), max_size=10), max_size=12))
def test_the_fast_splits_agree_with_the_exact_parser_on_any_record(records: list[str]) -> None:
    assert split_records(records) == [split_strict(record) for record in records]
    for record in records:
        if '""' in record:
            continue
        try:
            parsed: list[str | None] | None = [
                cell or None for cell in next(csv.reader([record], strict=True), [])
            ]
        except csv.Error:
            parsed = None
        if not record.rstrip("\r"):
            continue  # a blank record: the import skips it before splitting
        assert split_strict(record) == parsed, record


@given(TABLE, st.data())
def test_a_page_ends_exactly_on_a_record_boundary(table: list[list[str | None]], data: Any) -> None:
    encoded = [(_record(cells) + "\n").encode() for cells in table]
    blob = b"".join(encoded)
    ends = [0]
    for record in encoded:
        ends.append(ends[-1] + len(record))
    cut = data.draw(st.integers(min_value=0, max_value=len(blob)))
    found = complete_length(blob[:cut], at_eof=False, quoted=True)
    assert found == max(end for end in ends if end <= cut)


# The longest record TABLE can make: three cells of eight quotes, each doubled inside quotes
# and guarded (19 bytes), two commas, a CRLF and the BOM on the first one: 64 bytes. A page
# must hold it, or the import rightly refuses X_IMPORT_RECORD_TOO_LARGE.
LONGEST_RECORD = 3 * (2 + 2 * 8 + 1) + 2 + 2 + 3


@SLOW
@given(
    TABLE,
    st.integers(min_value=LONGEST_RECORD + 1, max_value=400),
    st.booleans(),
    st.booleans(),
    st.integers(min_value=1, max_value=7),
)
def test_export_then_import_is_the_identity_whatever_the_pages(
    table: list[list[str | None]], page_bytes: int, crlf: bool, bom: bool, batch: int
) -> None:
    rows = [dict(zip(COLUMNS, cells, strict=True)) for cells in table]

    async def scenario() -> list[Any]:
        registry = JobRegistry()
        driver = MemoryDriver()
        store = memory_sink()
        with use_driver(driver):
            export = export_rows(
                name="p.export",
                input=Org,
                tenant="none",
                prefix=lambda i: "out",
                source=lambda ctx, i: ListReader(rows),
                columns=COLUMNS,
                sink=lambda: store,
                batch=batch,
                registry=registry,
            )
            done = await run_one(driver, export, Org(), registry)
            assert done.state == JobState.DONE, done.last_error
            blob = b"".join(store.get(key) for key in store.keys("out/part-"))
            if crlf:
                blob = _crlf(blob)
            store.put("in.csv", (b"\xef\xbb\xbf" if bom else b"") + blob)
            handled = Handled()
            job = importer(
                registry,
                store,
                handled,
                columns=COLUMNS,
                schema=dict[str, str | None],
                page_bytes=page_bytes,
                max_record_bytes=page_bytes - 1,
                batch=batch,
            )
            back = await run_one(driver, job, Org(), registry)
            assert back.state == JobState.DONE, back.last_error
            assert back.result["rejected"] == 0
        await driver.close()
        return handled.rows

    imported = asyncio.run(scenario())
    assert imported == [{key: _guarded(value) for key, value in row.items()} for row in rows]


def _crlf(blob: bytes) -> bytes:
    """Turn every record-ending LF (one outside quotes) into CRLF."""
    out = bytearray()
    quoted = False
    for byte in blob:
        if byte == 0x22:
            quoted = not quoted
        if byte == 0x0A and not quoted:
            out += b"\r"
        out.append(byte)
    return bytes(out)
