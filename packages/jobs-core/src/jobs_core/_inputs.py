"""An input is stored faithfully or refused: the stored form of a job's input and its checks.

A row stores the input's JSON form and every attempt parses that form again, so that is what the
body gets. :func:`stored_input` answers the form only once it is proven to validate back to an
input equal to the one sent; otherwise the enqueue is refused with ``X_JOB_INPUT_INVALID``
naming the field and what changed (never a value). Rejected: trusting pydantic's JSON dump,
which turns a ``datetime`` in an ``Any`` field into text and a ``set`` into a list without a
word, and drops an aliased field's value on the way back.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pydantic import SecretStr, TypeAdapter, ValidationError

from jobs_core.errors import JobInputInvalidError
from jobs_core.serialization import (
    NotJSONError,
    dump_failure,
    first_difference,
    text_problem,
    to_json_form,
)
from jobs_core.types import JSONValue

_NUL = "\x00"


_LEAVES = frozenset(
    {"str", "int", "float", "bool", "none", "datetime", "date", "time", "timedelta", "uuid"}
    | {"decimal", "bytes", "enum"}
)
"""Schema types whose JSON form validates back to an equal value."""


def round_trips(schema: Any) -> bool:
    """Answer whether every value of a pydantic core schema comes back equal from its JSON form.

    A whitelist: plain scalars, enums, literals of JSON scalars, and lists, sets, tuples, dicts
    and models (no extra fields, no custom ``__init__``) made only of those. Anything else (an
    ``Any``, a union, a validator or serializer function, a secret, a recursive reference) is
    not known to, and the input is then proven by validating its stored form again.

    Args:
        schema: ``TypeAdapter(...).core_schema`` or a part of it.
    """
    if not isinstance(schema, dict) or "serialization" in schema:
        return False
    kind = schema.get("type")
    if kind in _LEAVES:
        return True
    if kind == "literal":
        return all(type(v) in (str, int, bool) or v is None for v in schema["expected"])
    if kind in ("nullable", "default", "model-field", "typed-dict-field", "dataclass-field"):
        return round_trips(schema["schema"])
    if kind in ("list", "set", "frozenset"):
        return "items_schema" in schema and round_trips(schema["items_schema"])
    if kind == "tuple":
        return all(round_trips(item) for item in schema["items_schema"])
    if kind == "dict":
        return round_trips(schema.get("keys_schema")) and round_trips(schema.get("values_schema"))
    if kind == "model":
        return (
            not schema.get("custom_init")
            and not schema.get("root_model")
            and not schema.get("post_init")
            and round_trips(schema["schema"])
        )
    if kind == "model-fields":
        return (
            schema.get("extra_behavior") != "allow"
            and "extras_schema" not in schema
            and all(round_trips(field) for field in schema["fields"].values())
        )
    return False


def stored_input(
    adapter: TypeAdapter[Any], parsed: Any, job: str, *, prove: bool = True
) -> JSONValue:
    """Answer the JSON form a row stores for ``parsed``, proven to give ``parsed`` back.

    A field typed ``Any`` (or ``dict``, ``list``, ``object``) holding a ``datetime``, a ``set``,
    ``bytes``, a ``Decimal``, a tuple or a UUID would come back as text or a list; a validator
    that changes what it is given again would give the body something else: both are refused.

    Args:
        adapter: the job's input adapter.
        parsed: the validated input.
        job: the job's name, for messages.
        prove: validate the stored form again and compare; ``False`` when the type is known to
            round-trip (:func:`round_trips`), which saves that second validation (~3 µs).

    Raises:
        JobInputInvalidError: ``X_JOB_INPUT_INVALID`` naming the field path (``meta["path"]``)
            and the cause (no JSON form, nested too deep, bytes not UTF-8, text no driver
            stores, or a value that does not come back); never a value.
    """
    try:
        live = adapter.dump_python(parsed, mode="python")
        stored = to_json_form(_faithful(adapter.dump_python(parsed, mode="json"), live))
    except NotJSONError as exc:
        raise JobInputInvalidError(
            f"input of {job} has no JSON form at {exc.path}: {exc.reason}", job=job, path=exc.path
        ) from None
    except (_BadKey, ValueError, TypeError, RecursionError) as exc:
        # pydantic's serializer refuses what it cannot dump (bytes that are not UTF-8, nesting
        # past its limit) with bare errors: name the place and the cause ourselves.
        path, cause = dump_failure(parsed) or (
            "$",
            f"pydantic cannot dump it ({type(exc).__name__})",
        )
        raise JobInputInvalidError(
            f"input of {job} has no JSON form at {short_path(path)}: {cause}", job=job, path=path
        ) from None
    if not prove:
        return stored
    try:
        again = adapter.validate_python(stored, by_alias=True, by_name=True)
    except ValidationError as exc:
        issues = exc.errors(include_url=False, include_input=False, include_context=False)
        raise JobInputInvalidError(
            f"input of {job} does not validate again from its stored JSON form (the body would "
            f"never get it): {issue_text(issues)}",
            job=job,
            issues=[{"loc": list(i["loc"]), "msg": i["msg"]} for i in issues],
        ) from None
    if again != parsed:
        found = first_difference(live, adapter.dump_python(again, mode="python"))
        path, change = found or ("$", "its JSON form validates to another value")
        raise JobInputInvalidError(
            f"input of {job} is not stored faithfully at {short_path(path)}: {change}; type the "
            "field (a datetime, set, bytes, Decimal, tuple or UUID needs a field of that type, "
            "not Any, dict, list or object), send JSON values, or make its validators give back "
            "what they are given",
            job=job,
            path=path,
            change=change,
        )
    return stored


def check_texts(job: str, fields: Sequence[tuple[str, str | None]]) -> None:
    """Refuse text no driver stores alike (U+0000, a lone surrogate) in any of ``fields``.

    Args:
        job: the job's name, for messages.
        fields: ``(field name, text or None)`` pairs.

    Raises:
        JobInputInvalidError: ``X_JOB_INPUT_INVALID`` naming the first bad field (never the text).
    """
    # One scan of all of them: plain ASCII without NUL, the usual case, costs nothing more.
    joined = "".join(text for _, text in fields if text is not None)
    if joined.isascii() and _NUL not in joined:
        return
    for field, value in fields:
        problem = None if value is None else text_problem(value)
        if problem is not None:
            raise JobInputInvalidError(
                f"{job}: {field} {problem}; send text every driver stores", job=job, field=field
            )


def issue_text(issues: Sequence[Any]) -> str:
    """Answer pydantic's validation issues as one line: ``loc: msg; ...`` (no input values)."""
    return "; ".join(
        f"{'.'.join(str(p) for p in issue['loc']) or '(root)'}: {issue['msg']}" for issue in issues
    )


def short_path(path: str) -> str:
    """Answer ``path`` for a message: a very deep one keeps its start and end."""
    return path if len(path) <= 120 else f"{path[:80]}…{path[-30:]}"


def _faithful(dumped: Any, live: Any) -> Any:
    """Undo the three things pydantic's JSON mode changes silently in an input.

    A ``SecretStr`` is dumped as ``"**********"``: the stored row must carry the real value or
    the body would receive the mask (operators never see it: the operator surface redacts it).
    A NaN or infinite float is dumped as ``null``: it is put back so :func:`to_json_form` refuses
    it, as it refuses it in a step output. A key holding text no driver stores (a lone
    surrogate) is dumped with replacement characters: it is refused here (:class:`_BadKey`), as
    :func:`to_json_form` refuses such text. ``live`` is the python-mode dump of the same value,
    whose shape matches ``dumped`` item for item.

    Raises:
        _BadKey: a key of ``live`` is text no driver stores.
    """
    if isinstance(live, SecretStr):
        return live.get_secret_value()
    if isinstance(live, float) and not math.isfinite(live):
        return live
    if isinstance(dumped, dict) and isinstance(live, dict):
        out = {}
        for (key, value), (original_key, original) in zip(
            dumped.items(), live.items(), strict=False
        ):
            if key != original_key and isinstance(original_key, str):
                problem = text_problem(original_key)
                if problem is not None:
                    raise _BadKey(problem)
            out[key] = _faithful(value, original)
        return out
    if isinstance(dumped, list) and isinstance(live, list | tuple):
        return [_faithful(v, o) for v, o in zip(dumped, live, strict=False)]
    return dumped


class _BadKey(Exception):
    """A key no driver stores; :func:`stored_input` finds where with :func:`dump_failure`."""
