"""The JSON form: what converts, what stays, and what is refused with its path."""

from __future__ import annotations

import json
import math
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from enum import Enum, IntEnum, StrEnum
from typing import Any
from uuid import UUID

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from jobs_core.serialization import NotJSONError, to_json_form


class Color(str, Enum):  # noqa: UP042 - the (str, Enum) mixin is the case under test
    RED = "red"


class Level(StrEnum):
    HIGH = "high"


class Priority(IntEnum):
    URGENT = 1


class Plain(Enum):
    A = "a"
    NESTED = {"k": 1}  # noqa: RUF012 - an Enum member, not a mutable class attribute


class Bad(Enum):
    SET = frozenset({1})


class Address(BaseModel):
    city: str
    at: datetime


class Customer(BaseModel):
    id: UUID
    balance: Decimal
    address: Address
    tags: list[str] = []


class UserId(str):
    pass


UID = UUID("12345678-1234-5678-1234-567812345678")
WHEN = datetime(2030, 1, 2, 3, 4, 5, 600000, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (WHEN, "2030-01-02T03:04:05.600000+00:00"),
        (
            datetime(2030, 1, 2, 3, 4, tzinfo=timezone(timedelta(hours=2))),
            "2030-01-02T03:04:00+02:00",
        ),
        (date(2030, 1, 2), "2030-01-02"),
        (time(3, 4, 5), "03:04:05"),
        (UID, "12345678-1234-5678-1234-567812345678"),
        (Decimal("9.50"), "9.50"),
        (Decimal("1E+3"), "1E+3"),
        (Color.RED, "red"),
        (Level.HIGH, "high"),
        (Priority.URGENT, 1),
        (Plain.A, "a"),
        (Plain.NESTED, {"k": 1}),
        (None, None),
        (True, True),
        (False, False),
        (0, 0),
        (2**70, 2**70),
        (1.5, 1.5),
        ("text", "text"),
        ("", ""),
        ((1, "a"), [1, "a"]),
        ([], []),
        ({}, {}),
    ],
)
def test_values_become_their_json_form(value: Any, expected: Any) -> None:
    out = to_json_form(value)
    assert out == expected
    assert type(out) is type(expected)
    assert json.loads(json.dumps(out)) == out


def test_subclasses_of_builtins_become_the_builtin_so_attempt_one_equals_a_replay() -> None:
    # A step answering Color.RED must answer what the replay decodes ("red"), not the member:
    # f"{Color.RED}" is "Color.RED", which would differ between attempt 1 and a replay.
    for value in (Color.RED, Level.HIGH, UserId("u-1"), Priority.URGENT):
        out = to_json_form(value)
        assert type(out) in (str, int)
        assert f"{out}" == f"{json.loads(json.dumps(out))}"
    keyed = to_json_form({Color.RED: 1, UserId("u"): 2})
    assert [type(k) for k in keyed] == [str, str]
    assert keyed == {"red": 1, "u": 2}


def test_pydantic_models_become_their_json_dump() -> None:
    customer = Customer(
        id=UID, balance=Decimal("10.25"), address=Address(city="Oslo", at=WHEN), tags=["a"]
    )
    out = to_json_form({"customer": customer, "list": [customer]})
    dumped = {
        "id": str(UID),
        "balance": "10.25",
        "address": {"city": "Oslo", "at": "2030-01-02T03:04:05.600000Z"},
        "tags": ["a"],
    }
    assert out == {"customer": dumped, "list": [dumped]}
    assert Customer.model_validate(out["customer"]) == customer


def test_nested_containers_are_walked_and_none_stays() -> None:
    value = {"a": [1, {"b": (UID, None)}], "c": {"d": Decimal("1")}, "e": None}
    assert to_json_form(value) == {"a": [1, {"b": [str(UID), None]}], "c": {"d": "1"}, "e": None}


def test_shared_non_cyclic_references_are_allowed() -> None:
    shared = [1, 2]
    inner = {"x": shared}
    value = {"a": shared, "b": shared, "c": [inner, inner, inner], "d": (shared, shared)}
    out = to_json_form(value)
    assert out == {
        "a": [1, 2],
        "b": [1, 2],
        "c": [{"x": [1, 2]}] * 3,
        "d": [[1, 2], [1, 2]],
    }
    # The answer is a fresh structure: mutating the input later does not change it.
    shared.append(3)
    assert out["a"] == [1, 2]


def _refused(value: Any) -> NotJSONError:
    with pytest.raises(NotJSONError) as caught:
        to_json_form(value)
    assert isinstance(caught.value, ValueError)
    assert str(caught.value) == f"{caught.value.path}: {caught.value.reason}"
    return caught.value


def _self_list() -> list[Any]:
    loop: list[Any] = [1]
    loop.append(loop)
    return loop


def _self_dict() -> dict[str, Any]:
    loop: dict[str, Any] = {"a": 1}
    loop["me"] = loop
    return loop


def _deep_cycle() -> dict[str, Any]:
    outer: dict[str, Any] = {"items": [{"name": "x"}]}
    outer["items"][0]["parent"] = outer
    return outer


@pytest.mark.parametrize(
    ("value", "path", "reason"),
    [
        (b"raw", "$", "bytes has no JSON form"),
        (bytearray(b"raw"), "$", "bytearray has no JSON form"),
        ({1, 2}, "$", "set has no JSON form"),
        (frozenset({1}), "$", "frozenset has no JSON form"),
        (object(), "$", "object has no JSON form"),
        (lambda: 1, "$", "function has no JSON form"),
        (timedelta(seconds=1), "$", "timedelta has no JSON form"),
        (math.nan, "$", "not a JSON number"),
        (math.inf, "$", "not a JSON number"),
        (-math.inf, "$", "not a JSON number"),
        (_self_list(), "$[1]", "cycle"),
        (_self_dict(), "$.me", "cycle"),
        (_deep_cycle(), "$.items[0].parent", "cycle"),
        ({1: "a"}, "$", "key 1 is not text"),
        ({None: "a"}, "$", "key None is not text"),
        ({("a", "b"): 1}, "$", "is not text"),
        ("a\x00b", "$", "U+0000"),
        ({"ok": ["fine", {"deep": "x\x00"}]}, "$.ok[1].deep", "U+0000"),
        ({"k\x00ey": 1}, "$", "key contains U+0000"),
        ({"outer": {"k\x00": 1}}, "$.outer", "key contains U+0000"),
        ({"a": [1, {"b": {3, 4}}]}, "$.a[1].b", "set has no JSON form"),
        ({"when": [WHEN, b"x"]}, "$.when[1]", "bytes"),
        (Bad.SET, "$", "frozenset"),
        ({"n": [1.0, math.nan]}, "$.n[1]", "not a JSON number"),
    ],
)
def test_values_json_cannot_hold_are_refused_with_the_path(
    value: Any, path: str, reason: str
) -> None:
    error = _refused(value)
    assert error.path == path
    assert reason in error.reason


def test_nul_inside_a_pydantic_model_is_refused() -> None:
    error = _refused(Address(city="Os\x00lo", at=WHEN))
    assert error.path == "$.city"


def test_refusal_does_not_quote_the_offending_text() -> None:
    error = _refused({"secret": "p@ss\x00word"})
    assert "p@ss" not in str(error)


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)))
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.text(
                alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
                max_size=5,
            ),
            children,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_json_values_are_their_own_json_form(value: Any) -> None:
    out = to_json_form(value)
    assert out == value
    assert json.loads(json.dumps(out, allow_nan=False)) == out
    assert to_json_form(out) == out
