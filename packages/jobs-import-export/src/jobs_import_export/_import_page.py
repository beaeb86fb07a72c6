"""One page of an import: bytes in, batches of validated rows and refusals out.

Pure (no I/O, no clock): :class:`Page` takes the bytes read at a checkpoint and yields
:class:`Batch` objects of at most ``batch`` records each, lazily, so a page holds its bytes, its
text and one batch of rows, whatever the file's size. The import's page step runs it on a worker
thread and hands each batch's rows to ``handle`` before the next is made.

A refused row becomes a :class:`Refusal` ``(line, field, code)``: the physical line the record
starts on, the column (``None`` for the record as a whole) and a code, which is a format rule of
:data:`REFUSALS` or the pydantic error type of the schema's rule (``int_parsing``, ``missing``,
...). The cell's value is never kept, so an error report cannot leak the data it refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from jobs_core.errors import ImportHeaderMismatchError, ImportRecordTooLargeError
from jobs_import_export import _csv
from jobs_import_export._records import BOM, complete_length, split_records
from jobs_import_export._untrusted import shown

REFUSALS: dict[str, str] = {
    "encoding": "the record is not valid UTF-8",
    "malformed": "the CSV record is not well-formed RFC 4180 (an unclosed quote, text after a "
    "closing quote, a bare CR)",
    "columns": "the CSV record has more or fewer cells than the header",
    "json": "the NDJSON line is not valid JSON",
    "not_object": "the NDJSON line is JSON but not an object",
    "undeclared": "the NDJSON object has a key outside columns (the field names it)",
}
"""The format rules a row can be refused by (the schema's own rules use pydantic's types)."""

_SURROGATE = re.compile("[\udc80-\udcff]")
"""What ``surrogateescape`` made of a byte that is not UTF-8."""

SHOWN_NAMES = 5
"""How many of a file's undeclared header cells a mismatch message shows."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """One refused row's entry in the error report: where and why, never what.

    Attributes:
        line: the physical line (1-based) the record starts on.
        field: the column, or ``None`` for the record as a whole.
        code: a key of :data:`REFUSALS` or a pydantic error type.
    """

    line: int
    field: str | None
    code: str

    def as_json(self) -> dict[str, Any]:
        """Answer the report line's object ``{line, field, code}``."""
        return {"line": self.line, "field": self.field, "code": self.code}


@dataclass(slots=True)
class Batch:
    """What one batch of records came to.

    Attributes:
        rows: the validated rows, in file order (what ``handle`` receives).
        refusals: one entry per problem (a row with two bad cells has two).
        rejected: how many rows were refused.
        last_line: the line the batch's last record starts on.
    """

    rows: list[Any] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    rejected: int = 0
    last_line: int = 0


@dataclass(frozen=True, slots=True)
class Layout:
    """A declaration's reading rules, shared by every page of every run.

    Attributes:
        format: ``"csv"`` or ``"ndjson"``.
        columns: the declared columns.
        row: validates one row mapping into the schema (``TypeAdapter(schema)``).
        batch: records per batch.
        max_record_bytes: the longest record accepted.
    """

    format: str
    columns: tuple[str, ...]
    row: TypeAdapter[Any]
    batch: int
    max_record_bytes: int

    @property
    def column_set(self) -> frozenset[str]:
        """The declared columns as a set."""
        return frozenset(self.columns)


class Page:
    """The records of one page, read from the bytes at a checkpoint.

    Args:
        layout: the declaration's rules.
        data: the bytes read at ``offset`` (at most ``page_bytes``).
        offset: where ``data`` starts in the object.
        line: physical lines before ``offset``.
        header: the CSV header found by an earlier page (file order), or ``None``.
        at_eof: ``data`` reaches the object's end.

    Attributes:
        consumed: bytes of ``data`` this page accounts for (a BOM included); the next page starts
            at ``offset + consumed``.
        lines: physical lines those bytes hold.
        header: the CSV header, once found.

    Raises:
        ImportRecordTooLargeError: ``X_IMPORT_RECORD_TOO_LARGE`` when ``data`` holds no whole
            record and more of the object follows.
    """

    def __init__(
        self,
        layout: Layout,
        data: bytes,
        *,
        offset: int,
        line: int,
        header: list[str] | None,
        at_eof: bool,
    ) -> None:
        self.layout = layout
        self.header = header
        self._first_line = line
        skip = len(BOM) if offset == 0 and data.startswith(BOM) else 0
        quoted = layout.format == "csv"
        end = complete_length(data[skip:], at_eof=at_eof, quoted=quoted)
        if end == 0 and not at_eof:
            raise ImportRecordTooLargeError(
                f"the record at line {line + 1} is longer than max_record_bytes="
                f"{layout.max_record_bytes:,} (no record ends within {len(data):,} bytes)",
                line=line + 1,
                max_record_bytes=layout.max_record_bytes,
            )
        self._region = data[skip : skip + end]
        self._firsts: list[int] | None = None
        self.consumed = skip + end
        self.lines = self._region.count(b"\n")

    def batches(self) -> Iterator[Batch]:
        """Yield the page's batches in file order (the CSV header is read, not yielded).

        A batch is ``batch`` records (blank lines among them are skipped, so it may hand fewer
        rows to ``handle``).

        Raises:
            ImportRecordTooLargeError: ``X_IMPORT_RECORD_TOO_LARGE`` for a record over
                ``max_record_bytes``.
            ImportHeaderMismatchError: ``X_IMPORT_HEADER_MISMATCH`` for a CSV header that does
                not name exactly the declared columns.
        """
        try:
            text = self._region.decode("utf-8")
            damaged = False
        except UnicodeDecodeError:
            # Keep every byte (a bad one as a lone surrogate) and refuse only its records.
            text = self._region.decode("utf-8", "surrogateescape")
            damaged = True
        csv_format = self.layout.format == "csv"
        records, self._firsts = split_records(text, quoted=csv_format)
        start = 0
        if csv_format and self.header is None:
            start = self._read_header(records)
        size = self.layout.batch
        for low in range(start, len(records), size):
            chunk = records[low : low + size]
            self._check_sizes(chunk, low)
            bad = self._undecodable(chunk) if damaged else None
            if csv_format:
                yield self._csv_batch(chunk, low, bad)
            else:
                yield self._ndjson_batch(chunk, low, bad)

    def _line(self, index: int) -> int:
        """Answer the physical line (1-based, in the object) record ``index`` starts on."""
        first = index if self._firsts is None else self._firsts[index]
        return self._first_line + first + 1

    def _read_header(self, records: list[str]) -> int:
        """Find the header (the first non-blank record); answer the index after it."""
        for index, record in enumerate(records):
            if record.rstrip("\r"):
                self._check_sizes([record], index)
                self.header = read_header(record, self.layout.columns)
                return index + 1
        return len(records)

    def _check_sizes(self, chunk: list[str], low: int) -> None:
        limit = self.layout.max_record_bytes
        # A character is at most 4 bytes: a chunk whose records are all this short is fine.
        if not chunk or max(map(len, chunk)) <= limit // 4:
            return
        for offset, record in enumerate(chunk):
            if _byte_length(record) > limit:
                line = self._line(low + offset)
                raise ImportRecordTooLargeError(
                    f"the record at line {line} is {_byte_length(record):,} bytes, over "
                    f"max_record_bytes={limit:,}",
                    line=line,
                    max_record_bytes=limit,
                )

    @staticmethod
    def _undecodable(chunk: list[str]) -> set[int]:
        return {offset for offset, record in enumerate(chunk) if _SURROGATE.search(record)}

    def _refuse(self, batch: Batch, index: int, field: str | None, code: str) -> None:
        batch.refusals.append(Refusal(self._line(index), field, code))
        batch.rejected += 1

    def _csv_batch(self, chunk: list[str], low: int, bad: set[int] | None) -> Batch:
        header = self.header
        assert header is not None
        width = len(header)
        validate = self.layout.row.validate_python
        batch = Batch(last_line=self._line(low + len(chunk) - 1))
        rows = batch.rows
        read = _csv.read_cells(chunk)
        every: list[list[str]] | list[_csv.Cells | None] = (
            read if read is not None else [_csv.split_strict(text) for text in chunk]
        )
        for offset, cells in enumerate(every):
            if cells is not None and "" in cells:
                cells = _csv.settle_empty(cells, chunk[offset])  # type: ignore[arg-type]
            if cells is not None and len(cells) == width and (bad is None or offset not in bad):
                try:
                    rows.append(validate(dict(zip(header, cells))))  # noqa: B905 - same length
                except ValidationError as exc:
                    self._refuse_invalid(batch, low + offset, exc)
            elif cells == []:
                continue  # a blank line
            elif bad is not None and offset in bad:
                self._refuse(batch, low + offset, None, "encoding")
            else:
                self._refuse(batch, low + offset, None, "malformed" if cells is None else "columns")
        return batch

    def _ndjson_batch(self, chunk: list[str], low: int, bad: set[int] | None) -> Batch:
        allowed = self.layout.column_set
        validate = self.layout.row.validate_python
        batch = Batch(last_line=self._line(low + len(chunk) - 1))
        for offset, text in enumerate(chunk):
            index = low + offset
            if not text.strip():
                continue  # a blank line
            if bad is not None and offset in bad:
                self._refuse(batch, index, None, "encoding")
                continue
            try:
                value = json.loads(text)
            except ValueError:
                self._refuse(batch, index, None, "json")
                continue
            if not isinstance(value, dict):
                self._refuse(batch, index, None, "not_object")
                continue
            if not value.keys() <= allowed:
                line = self._line(index)
                for key in sorted(value.keys() - allowed)[:SHOWN_NAMES]:
                    batch.refusals.append(Refusal(line, shown(key), "undeclared"))
                batch.rejected += 1
                continue
            try:
                batch.rows.append(validate(value))
            except ValidationError as exc:
                self._refuse_invalid(batch, index, exc)
        return batch

    def _refuse_invalid(self, batch: Batch, index: int, exc: ValidationError) -> None:
        line = self._line(index)
        for issue in exc.errors(include_url=False, include_input=False, include_context=False):
            location = issue["loc"]
            column = str(location[0]) if location else None
            batch.refusals.append(Refusal(line, column, issue["type"]))
        batch.rejected += 1


def _byte_length(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape"))


def read_header(record: str, columns: tuple[str, ...]) -> list[str]:
    """Answer the header's column names (file order) when they are exactly ``columns``.

    Raises:
        ImportHeaderMismatchError: ``X_IMPORT_HEADER_MISMATCH``: the declared names that are
            missing (whole) and the file's undeclared ones (a count and at most five, escaped and
            cut: a header cell is file content).
    """
    text = record.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    cells = _csv.split_strict(text)
    names = [cell or "" for cell in cells] if cells is not None else [text]
    declared = set(columns)
    missing = [name for name in columns if name not in names]
    undeclared = list(dict.fromkeys(name for name in names if name not in declared))
    twice = sorted({name for name in names if name in declared and names.count(name) > 1})
    if not missing and not undeclared and not twice:
        return names
    parts = []
    if missing:
        parts.append("missing " + ", ".join(repr(name) for name in missing))
    if twice:
        parts.append("named twice " + ", ".join(repr(name) for name in twice))
    if undeclared:
        sample = ", ".join(shown(name) for name in undeclared[:SHOWN_NAMES])
        more = "" if len(undeclared) <= SHOWN_NAMES else ", ..."
        parts.append(f"{len(undeclared)} undeclared in the file: {sample}{more}")
    raise ImportHeaderMismatchError(
        "the CSV header does not name the declared columns: " + "; ".join(parts),
        missing=missing,
        twice=twice,
        undeclared=len(undeclared),
        shown=[shown(name) for name in undeclared[:SHOWN_NAMES]],
    )


def no_header(columns: tuple[str, ...]) -> ImportHeaderMismatchError:
    """Answer the error for a CSV file that names no columns (empty, a BOM, blank lines)."""
    return ImportHeaderMismatchError(
        "the CSV file names no columns (it is empty, holds only a byte-order mark, or only blank "
        "lines); its first line must name " + ", ".join(repr(name) for name in columns),
        missing=list(columns),
        twice=[],
        undeclared=0,
        shown=[],
    )


__all__ = ["REFUSALS", "Batch", "Layout", "Page", "Refusal", "no_header", "read_header"]
