r"""CSV as the factories write and read it: RFC 4180 fields, ``\n`` line ends, ``None`` vs ``""``.

Writing: a field is quoted when it holds ``,``, ``"``, CR or LF, and when it is the empty string,
so that ``None`` (an empty, unquoted cell) and ``""`` (a quoted empty cell) survive a round trip.
Text cells that a spreadsheet would run as a formula get a leading ``'`` (the formula guard);
numbers are never touched, so ``-2`` stays a number while the text ``"-2"`` is guarded.

Reading: records arrive whole (boundaries are found on bytes, :mod:`._records`). Python 3.11's
``csv`` module cannot tell an empty cell from a quoted ``""``, so a record is split by the
cheapest way that is still exact for it: a record with no ``"`` by ``str.split``; one with quotes
but no ``""`` (so no quoted empty cell and no escaped quote) by ``csv.reader``, many records per
reader; the rest by :func:`split_strict`, a small exact parser. The three agree on every record
(a property test checks it); the fast two exist because a plain ``csv.reader`` loop is the floor
the import's throughput is measured against.
"""

from __future__ import annotations

import csv
import math
import re
from datetime import date, datetime, time
from decimal import Decimal
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
        One entry per record: its cells, or ``None`` when it is not well-formed RFC 4180 (a
        quote that never closes, text after a closing quote, a bare CR in an unquoted field).
    """
    out: list[Cells | None] = [None] * len(texts)
    batched: list[int] = []
    for index, text in enumerate(texts):
        if '"' not in text:
            text = text.rstrip("\r")
            if "\r" in text:
                continue
            out[index] = [cell or None for cell in text.split(",")]
        elif '""' in text:
            out[index] = split_strict(text)
        else:
            batched.append(index)
    if batched:
        _read_batched(texts, batched, out)
    return out


def _read_batched(texts: list[str], indexes: list[int], out: list[Cells | None]) -> None:
    """Split quoted records (none holding ``""``) with ``csv.reader``, many per reader.

    A reader fed a record whose quote stays open reads on into the next one; ``line_num`` says
    how many it took, and those records are split one by one by :func:`split_strict` instead.
    """
    start = 0
    while start < len(indexes):
        chunk = [texts[i] for i in indexes[start:]]
        reader = csv.reader(chunk, strict=True)
        done = 0
        try:
            for cells in reader:
                if reader.line_num != done + 1:
                    break
                out[indexes[start + done]] = [cell or None for cell in cells]
                done += 1
            else:
                return
        except csv.Error:
            pass
        stop = max(reader.line_num, done + 1)
        for offset in range(done, min(stop, len(chunk))):
            out[indexes[start + offset]] = split_strict(chunk[offset])
        start += max(stop, done + 1)


def split_strict(text: str) -> Cells | None:
    """Split one record exactly: ``None`` for an empty unquoted cell, ``""`` for ``""``.

    Follows ``csv.reader(strict=True)``: a quote inside an unquoted field is literal, a quoted
    field must be followed by ``,`` or the record's end, an unquoted field may not hold CR or LF.

    Returns:
        The cells, or ``None`` for a malformed record.
    """
    text = text.rstrip("\r")
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
