"""A database value as an export writes it.

Instants (``timestamptz``) are written as ISO 8601 in UTC, whatever the session's time zone; a
``timestamp`` without a zone is written as stored (it names no instant). Binary is base64 text,
an interval an ISO 8601 duration, ``json``/arrays nested in NDJSON and JSON text in a CSV cell,
and any other type (``inet``, ranges) its PostgreSQL text. What remains is what the
jobs-import-export encoders take as they are (text, numbers, ``Decimal``, dates, times, UUIDs).
"""

from __future__ import annotations

import base64
import json
import math
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

_AS_IS = (str, int, date, time, UUID)


def exported(value: Any, format: str) -> Any:
    """Answer ``value`` as the ``format`` (``"csv"`` or ``"ndjson"``) part holds it."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat() if value.tzinfo is not None else value.isoformat()
    if isinstance(value, _AS_IS):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Decimal):
        return value if value.is_finite() else str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, timedelta):
        return _duration(value)
    if isinstance(value, list | tuple | dict):
        nested = _nested(value)
        return json.dumps(nested, ensure_ascii=False) if format == "csv" else nested
    return str(value)


def _nested(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _nested(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_nested(v) for v in value]
    converted = exported(value, "ndjson")
    if isinstance(converted, date | time):
        return converted.isoformat()  # JSON text in a CSV cell has no date type
    if isinstance(converted, Decimal | UUID):
        return str(converted)
    return converted


def _duration(value: timedelta) -> str:
    sign = "-" if value < timedelta(0) else ""
    value = abs(value)
    seconds = value.seconds + value.microseconds / 1_000_000
    shown = f"{seconds:.6f}".rstrip("0").rstrip(".")
    return f"{sign}P{value.days}DT{shown}S"


__all__ = ["exported"]
