"""The JSON form: what steps persist and what rows store.

A step answers the persisted form of its result on every attempt, the first included, so attempt
1 and a replay see the same value. The rules (``10-core.md`` §2):

- ``None``, ``bool``, ``int``, finite ``float`` and ``str`` stay as they are;
- ``dict`` with ``str`` keys and ``list``/``tuple`` are walked (a tuple becomes a list);
- ``datetime``/``date``/``time`` become ISO 8601 text, ``UUID`` and ``Decimal`` their text,
  an ``Enum`` its value, a pydantic model ``model_dump(mode="json")``. Rebuild them on the read
  side (``datetime.fromisoformat(out)``, ``UUID(out)``, ``Model.model_validate(out)``);
- anything JSON cannot hold (bytes, sets, cycles, NaN and infinities, non-``str`` keys, arbitrary
  objects), any text containing U+0000 (PostgreSQL's ``jsonb`` cannot store it, so every
  driver refuses it alike) or a lone surrogate (U+D800..U+DFFF: no UTF-8 encodes it, so
  PostgreSQL refuses it and the memory and Redis drivers would answer another string), and
  anything nested deeper than :data:`~jobs_core.types.MAX_JSON_DEPTH` levels (Python's JSON
  decoder stops near 1,000, and a reader must be able to load what was stored) is refused with
  the path of the offending value.

``pydantic_core.to_jsonable_python`` was rejected: it silently turns sets into lists and bytes
into text, which would make a replay answer something the first attempt never saw.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from datetime import date, datetime, time
from decimal import Decimal
from enum import Enum
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from jobs_core.types import MAX_JSON_DEPTH, JSONValue

_SURROGATE = re.compile("[\ud800-\udfff]")


def text_problem(value: str) -> str | None:
    """Answer why no driver may store the text ``value``, or ``None`` when it may.

    Two things are refused everywhere alike: U+0000 (PostgreSQL text and ``jsonb`` cannot hold
    it) and a lone surrogate (U+D800..U+DFFF: no UTF-8 encodes one). The reason starts with
    "contains" and names the character's index, never the text.
    """
    if "\x00" in value:
        return f"contains U+0000 (NUL) at index {value.index(chr(0))}, which no driver stores"
    if not value.isascii():
        found = _SURROGATE.search(value)
        if found is not None:
            return (
                f"contains a lone surrogate (U+{ord(found.group()):04X}) at index "
                f"{found.start()}, which UTF-8 cannot encode"
            )
    return None


def json_text_has_surrogate(text: str) -> bool:
    r"""Answer whether JSON text (written with ``ensure_ascii``) holds a lone surrogate.

    Such text spells every character past ASCII as ``\uXXXX``; only text with a ``\ud``
    escape can hold one, and only then is it decoded and its strings looked at.
    """
    if "\\ud" not in text:
        return False
    try:
        stack: list[Any] = [json.loads(text)]
    except RecursionError:
        return False  # nested past what the decoder takes: refused by the depth rule upstream
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


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
    return _walk(value, "$", set(), 1)


def _walk(value: Any, path: str, seen: set[int], depth: int) -> JSONValue:
    # Subclasses of str/int/float (``class Color(str, Enum)``, ``IntEnum``, a ``UserId(str)``)
    # become the plain builtin, so attempt 1 answers exactly what a replay decodes from storage
    # (``f"{Color.RED}"`` is ``"Color.RED"`` but the stored form reads back as ``"red"``).
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, Enum):
        return _walk(value.value, path, seen, depth)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        # Plain ASCII without NUL, the usual text, costs no call.
        if not value.isascii() or "\x00" in value:
            problem = text_problem(value)
            if problem is not None:
                raise NotJSONError(path, f"text {problem}")
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
        return _walk(value.model_dump(mode="json"), path, seen, depth)
    if isinstance(value, dict | list | tuple):
        marker = id(value)
        if marker in seen:
            raise NotJSONError(path, "a cycle: the value contains itself")
        if depth > MAX_JSON_DEPTH:
            raise NotJSONError(path, f"nested deeper than {MAX_JSON_DEPTH} levels")
        seen.add(marker)
        try:
            if isinstance(value, dict):
                out: dict[str, JSONValue] = {}
                for key, item in value.items():
                    if not isinstance(key, str):
                        raise NotJSONError(path, f"key {key!r} is not text")
                    problem = text_problem(key) if not key.isascii() or "\x00" in key else None
                    if problem is not None:
                        raise NotJSONError(path, f"a key {problem}")
                    out[str.__str__(key)] = _walk(item, f"{path}.{key}", seen, depth + 1)
                return out
            return [_walk(item, f"{path}[{i}]", seen, depth + 1) for i, item in enumerate(value)]
        finally:
            seen.discard(marker)
    raise NotJSONError(path, f"{type(value).__name__} has no JSON form")


def dump_failure(value: Any) -> tuple[str, str] | None:
    """Answer ``(path, cause)`` of what keeps pydantic from dumping ``value``, where we can name it.

    pydantic's serializer gives up with a bare error on input nested past its own limit and on
    bytes that are not UTF-8, and mangles a key holding a lone surrogate; this walk (iterative,
    so any depth is safe) finds the first container nested deeper than
    :data:`~jobs_core.types.MAX_JSON_DEPTH` levels, the first bytes value that does not decode,
    or the first object with a key no driver stores, and says where.
    """
    stack: list[tuple[Any, str, int]] = [(value, "$", 1)]
    seen: set[int] = set()
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, bytes | bytearray | memoryview):
            try:
                bytes(item).decode("utf-8")
            except UnicodeDecodeError as exc:
                return path, f"bytes not UTF-8 at byte {exc.start}"
            continue
        children = _children(item, path)
        if children is None or id(item) in seen:
            continue
        if depth > MAX_JSON_DEPTH:
            return path, f"nested deeper than {MAX_JSON_DEPTH} levels"
        if isinstance(item, dict):
            for key in item:
                problem = text_problem(key) if isinstance(key, str) else None
                if problem is not None:
                    return path, f"a key {problem}"
        seen.add(id(item))
        stack.extend((child, where, depth + 1) for where, child in reversed(list(children)))
    return None


def _children(item: Any, path: str) -> Iterable[tuple[str, Any]] | None:
    if isinstance(item, BaseModel):
        fields = dict(item.__dict__)
        fields.update(item.__pydantic_extra__ or {})
        return ((f"{path}.{key}", value) for key, value in fields.items())
    if isinstance(item, dict):
        return ((f"{path}.{key}", value) for key, value in item.items())
    if isinstance(item, list | tuple | set | frozenset):
        return ((f"{path}[{i}]", value) for i, value in enumerate(item))
    return None


def first_difference(sent: Any, stored: Any, path: str = "$") -> tuple[str, str] | None:
    """Answer ``(path, what changed)`` where two python-mode dumps first differ.

    Used to name the field whose value its JSON form does not give back (a ``datetime`` in an
    ``Any`` field comes back as ``str``, a ``set`` as ``list``). What changed names types and
    counts, never values. Answers ``None`` when no difference is found (the values compare
    unequal for a reason the dumps do not show).
    """
    stack: list[tuple[Any, Any, str]] = [(sent, stored, path)]
    while stack:
        left, right, where = stack.pop()
        if type(left) is not type(right) and not (
            _number(left) and _number(right) and left == right
        ):
            return where, f"a {type(left).__name__} comes back as {type(right).__name__}"
        if isinstance(left, dict):
            if left.keys() != right.keys():
                return where, "an object comes back with other keys"
            stack.extend((left[k], right[k], f"{where}.{k}") for k in reversed(list(left)))
        elif isinstance(left, list | tuple):
            if len(left) != len(right):
                return where, f"{len(left)} items come back as {len(right)}"
            stack.extend(
                (a, b, f"{where}[{i}]")
                for i, (a, b) in reversed(list(enumerate(zip(left, right, strict=True))))
            )
        elif left != right:
            return where, f"a {type(left).__name__} comes back as another value"
    return None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
