"""How values cross into Redis: JSON text, canonical match forms, instants and optional text.

* JSON values (inputs, results, step outputs, event payloads) are stored as JSON text and decoded
  on every read, as the memory driver does; the same values are refused (not JSON, ``NaN``, a NUL
  character), so a job that one driver accepts is never refused by another (FIELD-FAILURES C22).
* Instants are integer microseconds since the Unix epoch, the resolution of the server's
  ``TIME``. Lua numbers are doubles, exact to 2^53 µs (the year 2255); later instants lose a few
  microseconds, which moves nothing that matters.
* Event matching compares top-level payload values with the memory driver's JSON equality
  (``True`` never equals ``1``, ``1`` equals ``1.0``). Lua's cjson cannot be trusted with that (it
  decodes ``{}`` and ``[]`` alike and rounds large integers), so Python writes each value in a
  canonical text and Lua compares texts.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from jobs_core.errors import DriverRequestInvalidError
from jobs_core.serialization import json_text_has_surrogate
from jobs_core.types import JSONValue

_ENCODE = json.JSONEncoder(allow_nan=False).encode
# A JSON ``\u0000`` escape, i.e. one not itself escaped by an odd run of backslashes.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)


def encode(value: JSONValue, what: str) -> str:
    """Answer ``value`` as JSON text, refusing what the memory and pg drivers refuse.

    Args:
        value: a JSON value.
        what: the field's name for the error message.

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` when ``value`` is not JSON (an
            arbitrary object, a cycle, ``NaN`` or an infinity) or holds a NUL character or a lone
            surrogate.
    """
    if value is None:  # most results: no encoder call
        return "null"
    try:
        text = _ENCODE(value)
    except (TypeError, ValueError) as exc:
        raise DriverRequestInvalidError(f"{what} is not a JSON value: {exc}", field=what) from exc
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise DriverRequestInvalidError(
            f"{what} holds a NUL character (U+0000), which no driver can store", field=what
        )
    if json_text_has_surrogate(text):
        raise DriverRequestInvalidError(
            f"{what} holds a lone surrogate (U+D800..U+DFFF), which UTF-8 cannot encode",
            field=what,
        )
    return text


def canonical(value: Any) -> str:
    """Answer a decoded JSON value as text that is equal exactly when the values are JSON-equal.

    Booleans stay booleans, integral floats become integers (``1.0`` is ``1``), object keys are
    sorted. ``value`` must already be a decoded JSON value (dicts, lists, str, int, float, bool,
    ``None``).
    """
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, dict):
        items = sorted(value.items())
        return "{" + ",".join(f"{json.dumps(k)}:{canonical(v)}" for k, v in items) + "}"
    return "[" + ",".join(canonical(v) for v in value) + "]"


def canonical_fields(text: str) -> str:
    """Answer a JSON object's top-level values as a JSON object of canonical texts.

    Args:
        text: JSON text from :func:`encode`.

    Returns:
        ``{"key": "<canonical text>", ...}`` as JSON text, or ``""`` when ``text`` is not an
        object (such a payload matches only a wait with no match).
    """
    value = json.loads(text)
    if not isinstance(value, dict):
        return ""
    return json.dumps({key: canonical(item) for key, item in value.items()})


def to_us(instant: datetime, what: str) -> int:
    """Answer an aware instant as microseconds since the epoch.

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive instant.
    """
    if instant.utcoffset() is None:
        raise DriverRequestInvalidError(f"{what} must be an aware datetime (UTC)", field=what)
    return (instant - _EPOCH) // _ONE_US


def from_us(text: str | int) -> datetime:
    """Answer microseconds since the epoch (as Redis returns them) as an aware UTC instant."""
    return _EPOCH + timedelta(microseconds=int(text))


def opt(value: str | None) -> str:
    """Encode optional text for a row field: ``""`` is ``None``, else ``"="`` and the text."""
    return "" if value is None else "=" + value


def unopt(field: str | None) -> str | None:
    """Decode a field written by :func:`opt` (a missing field is ``None`` too)."""
    return field[1:] if field else None


def live_field(name: str, tenant_id: str | None, key: str) -> str:
    """Answer the field naming one live key ``(name, tenant or '', key)`` unambiguously.

    Lengths prefix the first two parts, so no choice of separator characters in a name can make
    two keys collide.
    """
    tenant = tenant_id or ""
    return f"{len(name)}:{name}{len(tenant)}:{tenant}{key}"
