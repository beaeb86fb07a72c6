"""The JSON form: what steps persist and what rows store.

A step answers the persisted form of its result on every attempt, the first included, so attempt
1 and a replay see the same value. The rules (``10-core.md`` §2):

- ``None``, ``bool``, ``int``, finite ``float`` and ``str`` stay as they are;
- ``dict`` with ``str`` keys and ``list``/``tuple`` are walked (a tuple becomes a list);
- ``datetime``/``date``/``time`` become ISO 8601 text, ``UUID`` and ``Decimal`` their text,
  an ``Enum`` its value, a pydantic model ``model_dump(mode="json")``. Rebuild them on the read
  side (``datetime.fromisoformat(out)``, ``UUID(out)``, ``Model.model_validate(out)``);
- anything JSON cannot hold (bytes, sets, cycles, NaN and infinities, non-``str`` keys, arbitrary
  objects) and any text containing U+0000 (PostgreSQL's ``jsonb`` cannot store it, so every
  driver refuses it alike) is refused with the path of the offending value.

``pydantic_core.to_jsonable_python`` was rejected: it silently turns sets into lists and bytes
into text, which would make a replay answer something the first attempt never saw.
"""

from __future__ import annotations

import math
from datetime import date, datetime, time
from decimal import Decimal
from enum import Enum
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from jobs_core.types import JSONValue


class NotJSONError(ValueError):
    """A value has no JSON form; ``path`` names where (``$.a[2].b``)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


def to_json_form(value: Any) -> JSONValue:
    """Answer the JSON form of ``value`` by the rules in this module's docstring.

    Raises:
        NotJSONError: ``value`` (or something inside it) has no JSON form; the error names the path.
    """
    return _walk(value, "$", set())


def _walk(value: Any, path: str, seen: set[int]) -> JSONValue:
    # Subclasses of str/int/float (``class Color(str, Enum)``, ``IntEnum``, a ``UserId(str)``)
    # become the plain builtin, so attempt 1 answers exactly what a replay decodes from storage
    # (``f"{Color.RED}"`` is ``"Color.RED"`` but the stored form reads back as ``"red"``).
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, Enum):
        return _walk(value.value, path, seen)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        if "\x00" in value:
            raise NotJSONError(path, "text contains U+0000 (NUL), which no driver stores")
        return str.__str__(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NotJSONError(path, f"{value!r} is not a JSON number")
        return float(value)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, UUID | Decimal):
        return str(value)
    if isinstance(value, BaseModel):
        return _walk(value.model_dump(mode="json"), path, seen)
    if isinstance(value, dict | list | tuple):
        marker = id(value)
        if marker in seen:
            raise NotJSONError(path, "a cycle: the value contains itself")
        seen.add(marker)
        try:
            if isinstance(value, dict):
                out: dict[str, JSONValue] = {}
                for key, item in value.items():
                    if not isinstance(key, str):
                        raise NotJSONError(path, f"key {key!r} is not text")
                    if "\x00" in key:
                        raise NotJSONError(path, "a key contains U+0000 (NUL)")
                    out[str.__str__(key)] = _walk(item, f"{path}.{key}", seen)
                return out
            return [_walk(item, f"{path}[{i}]", seen) for i, item in enumerate(value)]
        finally:
            seen.discard(marker)
    raise NotJSONError(path, f"{type(value).__name__} has no JSON form")
