r"""NDJSON as the factories write and read it: one JSON object per ``\n``-terminated line.

Writing: keys in ``columns`` order, compact separators, UTF-8 (not ``\u`` escapes); values as
the core stores step outputs: ``Decimal``, dates, times and UUIDs become their text, NaN and
infinities are refused. No formula guard: NDJSON is not opened by spreadsheets.
"""

from __future__ import annotations

import json
import math
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any
from uuid import UUID

from jobs_import_export._csv import CellUnholdable

_DUMP = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def json_value(value: object) -> Any:
    """Answer ``value`` as something ``json`` writes (lists and dicts converted item by item).

    Raises:
        CellUnholdable: a value with no JSON form (its type name only), NaN or an infinity.
    """
    kind = type(value)
    if value is None or kind is str or kind is int or kind is bool:
        return value
    if kind is float:
        if not math.isfinite(value):  # type: ignore[arg-type]
            raise CellUnholdable("a NaN or infinite float")
        return value
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise CellUnholdable("a NaN or infinite Decimal")
        return str(value)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    # Subclasses (enum members of a str or int type): their plain value.
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return json_value(float(value))
    if isinstance(value, list | tuple):
        return [json_value(item) for item in value]
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise CellUnholdable("a dict with non-text keys")
        return {key: json_value(item) for key, item in value.items()}
    raise CellUnholdable(type(value).__name__)


def ndjson_line(values: dict[str, Any]) -> str:
    r"""Answer one record: ``values`` (already :func:`json_value` forms) as a ``\n``-ended line."""
    return _DUMP(values) + "\n"


__all__ = ["json_value", "ndjson_line"]
