r"""CSV as the factories write and read it: RFC 4180 fields, ``\n`` line ends, ``None`` vs ``""``.

Writing: a field is quoted when it holds ``,``, ``"``, CR or LF, and when it is the empty string,
so that ``None`` (an empty, unquoted cell) and ``""`` (a quoted empty cell) survive a round trip.
Text cells that a spreadsheet would run as a formula get a leading ``'`` (the formula guard);
numbers are never touched, so ``-2`` stays a number while the text ``"-2"`` is guarded.

Reading: records arrive whole (boundaries are found on bytes, :mod:`._records`) and
``csv.reader`` splits them, many records per reader. Python 3.11's ``csv`` cannot tell an empty
cell from a quoted ``""``, so when it answers an empty cell in a record that holds ``""``, that
record is split again by :func:`split_strict`, a small exact parser; in any other record an empty
cell can only be an unquoted one, ``None``. The two agree on every record (a property test
checks it); the reader is there because a plain ``csv.reader`` loop is the floor the import's
throughput is measured against.
"""

from __future__ import annotations

import csv
import math
import re
from datetime import date, datetime, time
from decimal import Decimal
from typing import cast
from uuid import UUID

FORMULA_TRIGGERS = frozenset("=+-@\t\r\uff1d\uff0b\uff0d\uff20")
"""First characters that make a spreadsheet treat a text cell as a formula.

``=``, ``+``, ``-``, ``@``, TAB and CR (OWASP's list), and their full-width forms (U+FF1D,
U+FF0B, U+FF0D, U+FF20), which some spreadsheets fold to ASCII.
"""

GUARD = "'"
"""What the formula guard puts before a triggering text cell (never removed on import)."""

_NEEDS_QUOTES = re.compile(r'[",\r\n]')

Cells = list[str | None]


class CellUnholdable(Exception):
    """A value has no CSV or JSON form here; carries the value's type name, never the value."""


def text_cell(value: str) -> str:
    """Answer one text cell as written: guarded against formulas, quoted when it must be."""
    if not value:
        return '""'
    if value[0] in FORMULA_TRIGGERS:
        value = GUARD + value
    if _NEEDS_QUOTES.search(value) is not None:
        return '"' + value.replace('"', '""') + '"'
    return value


def csv_cell(value: object) -> str:
    """Answer one cell of a CSV record.

    ``None`` is an empty cell, ``""`` a quoted empty cell, text goes through :func:`text_cell`,
    ``bool`` is ``true``/``false``, ``int``/``float``/``Decimal`` their shortest exact text (never
    guarded), dates, times and datetimes their ISO 8601 form, a UUID its canonical text.

    Raises:
        CellUnholdable: any other value, NaN or an infinity.
    """
    kind = type(value)
    if kind is str:
        return text_cell(value)  # type: ignore[arg-type]
    if value is None:
        return ""
    if kind is int:
        return str(value)
    return _other_cell(value)


def _other_cell(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CellUnholdable("a NaN or infinite float")
        return repr(value)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise CellUnholdable("a NaN or infinite Decimal")
        return str(value)
    if isinstance(value, str):
        return text_cell(str.__str__(value))
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    raise CellUnholdable(type(value).__name__)


def header_line(columns: list[str]) -> str:
    r"""Answer the header record (``\n``-terminated); column names are quoted, never guarded."""
    return ",".join(_quote_name(name) for name in columns) + "\n"


def _quote_name(name: str) -> str:
    if _NEEDS_QUOTES.search(name) is not None or not name:
        return '"' + name.replace('"', '""') + '"'
    return name


def split_records(texts: list[str]) -> list[Cells | None]:
    r"""Split decoded records into cells (``None`` for an empty unquoted cell).

    Args:
        texts: whole records, each without its ``\n`` (trailing ``\r`` are a CRLF line end, as
            ``csv`` reads them).

    Returns:
        One entry per record: its cells (``[]`` for a blank record), or ``None`` when it is not
        well-formed RFC 4180 (a quote that never closes, text after a closing quote, a bare CR
        in an unquoted field).
    """
    rows = read_cells(texts)
    if rows is None:
        return [split_strict(text) for text in texts]
    return [
        settle_empty(cells, text) if "" in cells else cast(Cells, cells)
        for cells, text in zip(rows, texts, strict=True)
    ]


def read_cells(texts: list[str]) -> list[list[str]] | None:
    """Read every record with one ``csv.reader``; ``None`` when any is malformed.

    An empty cell in the answer may be unquoted (``None``) or a quoted ``""``: settle it with
    :func:`settle_empty`. A record whose quote never closes makes the reader read on into the
    next record (so fewer rows come back) or fail: either way ``None``, and the caller splits
    the records one by one with :func:`split_strict`.
    """
    try:
        rows = list(csv.reader(texts, strict=True))
    except csv.Error:
        return None
    # No record yields two rows (none holds an unquoted newline), so equal counts mean aligned.
    return rows if len(rows) == len(texts) else None


def settle_empty(cells: list[str], text: str) -> Cells | None:
    """Answer the exact cells of ``text``, given what ``csv`` read from it (with an empty cell).

    Without ``""`` in the record every empty cell is an unquoted one, made ``None`` in place;
    with it only :func:`split_strict` can tell a quoted empty cell from an escaped quote.
    """
    if '""' in text:
        return split_strict(text)
    index = -1
    for _ in range(cells.count("")):
        index = cells.index("", index + 1)
        cells[index] = None  # type: ignore[call-overload]
    return cast(Cells, cells)


def split_strict(text: str) -> Cells | None:
    """Split one record exactly: ``None`` for an empty unquoted cell, ``""`` for ``""``.

    Follows ``csv.reader(strict=True)``: a quote inside an unquoted field is literal, a quoted
    field must be followed by ``,`` or the record's end, an unquoted field may not hold CR or LF.

    Returns:
        The cells (``[]`` for a blank record, as ``csv`` answers), or ``None`` for a malformed
        record.
    """
    text = text.rstrip("\r")
    if not text:
        return []
    cells: Cells = []
    end = len(text)
    pos = 0
    while True:
        if pos < end and text[pos] == '"':
            pieces = []
            scan = pos + 1
            while True:
                close = text.find('"', scan)
                if close < 0:
                    return None
                pieces.append(text[scan:close])
                if close + 1 < end and text[close + 1] == '"':
                    pieces.append('"')
                    scan = close + 2
                    continue
                pos = close + 1
                break
            cells.append("".join(pieces))
            if pos == end:
                return cells
            if text[pos] != ",":
                return None
            pos += 1
        else:
            comma = text.find(",", pos)
            stop = end if comma < 0 else comma
            cell = text[pos:stop]
            if "\r" in cell or "\n" in cell:
                return None
            cells.append(cell or None)
            if comma < 0:
                return cells
            pos = comma + 1


__all__ = [
    "FORMULA_TRIGGERS",
    "GUARD",
    "CellUnholdable",
    "csv_cell",
    "header_line",
    "split_records",
    "split_strict",
    "text_cell",
]
