"""One page of an import: bytes in, batches of validated rows and refusals out.

Pure (no I/O, no clock): :class:`Page` takes the bytes read at a checkpoint and yields
:class:`Batch` objects of at most ``batch`` records each, lazily, so a page holds its bytes plus
one batch of rows, whatever the rows' size. The import's step drives it from a worker thread, one
batch per hop, and hands each batch's rows to ``handle`` in between.

A refused row becomes a :class:`Refusal` ``(line, field, code)``: the physical line the record
starts on, the column (``None`` for the record as a whole) and a code, which is a format rule of
:data:`REFUSALS` or the pydantic error type of the schema's rule (``int_parsing``, ``missing``,
...). The cell's value is never kept, so an error report cannot leak the data it refused.
"""

from __future__ import annotations

import json
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
        rows: validates a list of row mappings into the schema (``TypeAdapter(list[schema])``).
        batch: records per batch.
        max_record_bytes: the longest record accepted.
    """

    format: str
    columns: tuple[str, ...]
    rows: TypeAdapter[Any]
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
        self.consumed = skip + end
        self.lines = self._region.count(b"\n")

    def batches(self) -> Iterator[Batch]:
        """Yield the page's batches in file order (the CSV header is read, not yielded).

        Raises:
            ImportRecordTooLargeError: ``X_IMPORT_RECORD_TOO_LARGE`` for a record over
                ``max_record_bytes``.
            ImportHeaderMismatchError: ``X_IMPORT_HEADER_MISMATCH`` for a CSV header that does
                not name exactly the declared columns.
        """
        layout = self.layout
        limit = layout.max_record_bytes
        csv_format = layout.format == "csv"
        pending: list[tuple[int, bytes]] = []
        for first, record in split_records(self._region, quoted=csv_format):
            if not record.rstrip(b"\r"):
                continue  # a blank line (CRs only count as a line end)
            line = self._first_line + first + 1
            if len(record) > limit:
                raise ImportRecordTooLargeError(
                    f"the record at line {line} is {len(record):,} bytes, over "
                    f"max_record_bytes={limit:,}",
                    line=line,
                    max_record_bytes=limit,
                )
            if csv_format and self.header is None:
                self.header = read_header(record, layout.columns)
                continue
            pending.append((line, record))
            if len(pending) == layout.batch:
                yield self._batch(pending)
                pending = []
        if pending:
            yield self._batch(pending)

    def _batch(self, records: list[tuple[int, bytes]]) -> Batch:
        batch = Batch(last_line=records[-1][0])
        texts: list[str] = []
        lines: list[int] = []
        for line, record in records:
            try:
                texts.append(record.decode("utf-8"))
            except UnicodeDecodeError:
                batch.refusals.append(Refusal(line, None, "encoding"))
                batch.rejected += 1
                continue
            lines.append(line)
        if self.layout.format == "csv":
            values, value_lines = self._csv_rows(texts, lines, batch)
        else:
            values, value_lines = self._ndjson_rows(texts, lines, batch)
        if values:
            batch.rows = self._validate(values, value_lines, batch)
        batch.refusals.sort(key=lambda refusal: refusal.line)
        return batch

    def _csv_rows(
        self, texts: list[str], lines: list[int], batch: Batch
    ) -> tuple[list[dict[str, Any]], list[int]]:
        header = self.header
        assert header is not None
        width = len(header)
        values: list[dict[str, Any]] = []
        value_lines: list[int] = []
        for line, cells in zip(lines, _csv.split_records(texts), strict=True):
            if cells is None or len(cells) != width:
                batch.refusals.append(
                    Refusal(line, None, "malformed" if cells is None else "columns")
                )
                batch.rejected += 1
                continue
            values.append(dict(zip(header, cells, strict=True)))
            value_lines.append(line)
        return values, value_lines

    def _ndjson_rows(
        self, texts: list[str], lines: list[int], batch: Batch
    ) -> tuple[list[dict[str, Any]], list[int]]:
        allowed = self.layout.column_set
        values: list[dict[str, Any]] = []
        value_lines: list[int] = []
        for line, text in zip(lines, texts, strict=True):
            try:
                value = json.loads(text)
            except ValueError:
                batch.refusals.append(Refusal(line, None, "json"))
                batch.rejected += 1
                continue
            if not isinstance(value, dict):
                batch.refusals.append(Refusal(line, None, "not_object"))
                batch.rejected += 1
                continue
            if not value.keys() <= allowed:
                for key in sorted(value.keys() - allowed)[:SHOWN_NAMES]:
                    batch.refusals.append(Refusal(line, shown(key), "undeclared"))
                batch.rejected += 1
                continue
            values.append(value)
            value_lines.append(line)
        return values, value_lines

    def _validate(self, values: list[dict[str, Any]], lines: list[int], batch: Batch) -> list[Any]:
        try:
            valid: list[Any] = self.layout.rows.validate_python(values)
            return valid
        except ValidationError as exc:
            failed = exc.errors(include_url=False, include_input=False, include_context=False)
        bad: set[int] = set()
        for issue in failed:
            location = issue["loc"]
            index = location[0]
            assert isinstance(index, int)
            bad.add(index)
            column = str(location[1]) if len(location) > 1 else None
            batch.refusals.append(Refusal(lines[index], column, issue["type"]))
        batch.rejected += len(bad)
        # Items validate independently: the rest of the batch is one more call, not one per row.
        rest: list[Any] = self.layout.rows.validate_python(
            [value for index, value in enumerate(values) if index not in bad]
        )
        return rest


def read_header(record: bytes, columns: tuple[str, ...]) -> list[str]:
    """Answer the header's column names (file order) when they are exactly ``columns``.

    Raises:
        ImportHeaderMismatchError: ``X_IMPORT_HEADER_MISMATCH``: the declared names that are
            missing (whole) and the file's undeclared ones (a count and at most five, escaped and
            cut: a header cell is file content).
    """
    text = record.decode("utf-8", "backslashreplace")
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
