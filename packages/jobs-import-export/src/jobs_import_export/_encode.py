r"""One part's bytes from records, as ``export_rows`` writes them, for other packages' exports.

:func:`encode_records` is the public face of the CSV and NDJSON writers (:mod:`._csv`,
:mod:`._ndjson`): the same quoting, formula guard and value forms, so an export written by
another package (jobs-subject's) reads back through ``import_rows`` like one of ours.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from jobs_core.errors import ExportRowInvalidError
from jobs_import_export._csv import CellUnholdable, csv_cell, header_line
from jobs_import_export._declare import FORMATS, Format
from jobs_import_export._ndjson import json_value, ndjson_line


def encode_records(
    columns: Sequence[str],
    records: Iterable[Mapping[str, Any]],
    *,
    format: Format,
    header: bool = False,
) -> bytes:
    r"""Answer ``records`` encoded as one part: UTF-8, every line ending in ``\n``.

    Args:
        columns: the columns in file order; a record's other keys are ignored and a column it
            lacks is ``None`` (an empty cell, a JSON ``null``).
        records: ``{column: value}`` mappings. Values: text, ``int``, ``float``, ``Decimal``,
            ``bool``, ``None``, dates, times, datetimes (ISO 8601), UUIDs; NDJSON also takes lists
            and dicts of those.
        format: ``"csv"`` (RFC 4180, the formula guard on text cells) or ``"ndjson"``.
        header: start with the CSV header line (ignored for NDJSON).

    Raises:
        ExportRowInvalidError: ``X_EXPORT_ROW_INVALID`` naming the record's index and column
            (never the value) for a value the format cannot hold, NaN or an infinity, or a
            text holding a lone surrogate.
        ValueError: a format other than ``"csv"`` or ``"ndjson"``.
    """
    if format not in FORMATS:
        raise ValueError(f"format: must be 'csv' or 'ndjson', got {format!r}")
    names = list(columns)
    lines: list[str] = [header_line(names)] if header and format == "csv" else []
    for number, record in enumerate(records):
        try:
            if format == "csv":
                lines.append(",".join([csv_cell(record.get(name)) for name in names]) + "\n")
            else:
                lines.append(ndjson_line({name: json_value(record.get(name)) for name in names}))
        except CellUnholdable:
            raise _unholdable(record, names, number, format) from None
    try:
        return "".join(lines).encode("utf-8")
    except UnicodeEncodeError:
        raise ExportRowInvalidError(
            "a text value holds a lone surrogate, which UTF-8 cannot encode"
        ) from None


def _unholdable(
    record: Mapping[str, Any], names: list[str], number: int, format: Format
) -> ExportRowInvalidError:
    convert = csv_cell if format == "csv" else json_value
    for name in names:
        try:
            convert(record.get(name))
        except CellUnholdable as exc:
            return ExportRowInvalidError(
                f"record {number}, column {name!r}: a {exc} has no {format} form",
                row=number,
                column=name,
            )
    raise AssertionError("a cell failed to convert once, then converted")


__all__ = ["encode_records"]
