"""An input is stored faithfully or refused, every string obeys one rule, refusals name the cause.

The worker re-parses the stored JSON form at every attempt, so that is what a body gets: an
input whose stored form does not give it back (a ``datetime`` in an ``Any`` field comes back as
text, a ``set`` as a list) is refused at enqueue with ``X_JOB_INPUT_INVALID`` naming the field.
Every refusal is checked to write nothing and to quote no payload value.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel, Field, SecretStr, TypeAdapter, field_validator

from jobs_core import MAX_ENQUEUE_BATCH, Actor, JobRegistry, job
from jobs_core._inputs import round_trips
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import IdempotencyRequiredError, JobInputInvalidError
from jobs_core.types import MAX_JSON_DEPTH, ClaimRequest

SECRET = "s3cr3t-payload"
WHEN = datetime(2026, 3, 1, 12, 30, tzinfo=UTC)
ID = UUID("0192f1a0-0000-7000-8000-000000000001")


class Loose(BaseModel):
    key: str
    anything: Any = None
    mapping: dict[str, Any] = {}
    items: list[Any] = []
    thing: object = None


class Typed(BaseModel):
    key: str
    at: datetime
    day: date
    tags: set[str]
    blob: bytes
    amount: Decimal
    pair: tuple[int, str]
    ref: UUID
    nested: dict[str, datetime] = {}


class Aliased(BaseModel):
    key: str
    note: str = Field(default="", alias="Note")


class Stamped(BaseModel):
    """A validator that does not give back what it is given: each parse adds a mark."""

    key: str
    text: str

    @field_validator("text")
    @classmethod
    def _mark(cls, value: str) -> str:
        return value + "!"


class Raw(BaseModel):
    key: str
    blob: bytes = b""
    anything: Any = None


async def _noop(input: Any, step: Any, ctx: Any) -> None:
    return None


def declare(registry: JobRegistry, model: type[BaseModel], name: str, **options: Any) -> Any:
    fields: dict[str, Any] = {
        "input": model,
        "idempotency_key": lambda i: i.key,
        "tenant": "none",
    }
    fields.update(options)
    return job(**fields, name=name, registry=registry)(_noop)


async def rows(driver: MemoryDriver) -> int:
    return sum(
        s.ready + s.delayed + s.running + s.suspended + s.done + s.failed + s.dead + s.cancelled
        for s in await driver.stats()
    )


async def stored_and_parsed(driver: MemoryDriver, handle: Any) -> tuple[Any, Any]:
    [claimed] = await driver.claim(ClaimRequest(["default"], 1, 30_000, "w"))
    return claimed.input, handle.parse_input(claimed.input)


@pytest.mark.parametrize(
    ("field", "value", "path", "sent"),
    [
        ("anything", WHEN, "$.anything", "datetime"),
        ("anything", {"a", "b"}, "$.anything", "set"),
        ("anything", b"raw", "$.anything", "bytes"),
        ("anything", Decimal("1.10"), "$.anything", "Decimal"),
        ("anything", (1, "x"), "$.anything", "tuple"),
        ("anything", ID, "$.anything", "UUID"),
        ("mapping", {"when": WHEN}, "$.mapping.when", "datetime"),
        ("items", [1, {"ids": frozenset({1})}], "$.items[1].ids", "frozenset"),
        ("thing", date(2026, 1, 2), "$.thing", "date"),
    ],
)
async def test_a_value_its_json_form_does_not_give_back_is_refused_naming_the_field(
    driver: MemoryDriver, registry: JobRegistry, field: str, value: Any, path: str, sent: str
) -> None:
    loose = declare(registry, Loose, "faithful.loose")
    with pytest.raises(JobInputInvalidError) as caught:
        await loose.enqueue(Loose(key=SECRET, **{field: value}))
    error = caught.value
    assert error.code == "X_JOB_INPUT_INVALID"
    assert error.meta["path"] == path
    assert f"a {sent} comes back as" in str(error)
    assert "type the field" in str(error)
    assert SECRET not in str(error) and SECRET not in repr(error.meta)
    assert await rows(driver) == 0
    with pytest.raises(JobInputInvalidError):
        await loose.enqueue_many([Loose(key="fine"), Loose(key=SECRET, **{field: value})])
    assert await rows(driver) == 0


async def test_json_values_in_loose_fields_and_every_typed_field_round_trip(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    loose = declare(registry, Loose, "faithful.loose-ok")
    sent = Loose(
        key="k", anything={"n": 1, "f": 1.5, "ok": True}, mapping={"a": [1, "b"]}, items=[None]
    )
    await loose.enqueue(sent)
    assert (await stored_and_parsed(driver, loose))[1] == sent
    typed = declare(registry, Typed, "faithful.typed")
    value = Typed(
        key="t",
        at=WHEN,
        day=date(2026, 1, 2),
        tags={"a", "b"},
        blob=b"bytes",
        amount=Decimal("1.10"),
        pair=(1, "x"),
        ref=ID,
        nested={"x": WHEN},
    )
    await typed.enqueue(value)
    stored, parsed = await stored_and_parsed(driver, typed)
    assert parsed == value, "what the body gets equals what was sent"
    assert isinstance(stored["at"], str) and isinstance(stored["blob"], str)


async def test_a_field_with_an_alias_reaches_the_body(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    """The stored form names fields, not aliases; the body once got the default instead."""
    aliased = declare(registry, Aliased, "faithful.alias")
    await aliased.enqueue({"key": "k", "Note": "door code"})
    stored, parsed = await stored_and_parsed(driver, aliased)
    assert stored["note"] == "door code"
    assert parsed.note == "door code"


async def test_an_input_whose_validators_change_it_again_is_refused(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    stamped = declare(registry, Stamped, "faithful.stamped")
    with pytest.raises(JobInputInvalidError) as caught:
        await stamped.enqueue({"key": "k", "text": SECRET})
    assert caught.value.meta["path"] == "$.text"
    assert SECRET not in str(caught.value)
    assert await rows(driver) == 0


class Secret(BaseModel):
    key: str
    token: SecretStr


def test_only_a_type_not_known_to_round_trip_is_proven_at_each_enqueue() -> None:
    """Proving costs a second validation (~3 µs): typed inputs skip it, loose ones never do."""
    assert round_trips(TypeAdapter(Typed).core_schema)
    assert round_trips(TypeAdapter(Aliased).core_schema)
    assert round_trips(TypeAdapter(list[dict[str, int]]).core_schema)
    for loose in (Loose, Stamped, Raw, Secret, int | str, dict, list, Any, object):
        assert not round_trips(TypeAdapter(loose).core_schema), loose


# --- one rule for every string -------------------------------------------------------------


async def test_lone_surrogates_are_refused_in_payloads_keys_tenants_and_queues(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    plain = declare(registry, Loose, "faithful.sur")
    keyed = declare(registry, Loose, "faithful.sur-key", idempotency_key=lambda i: i.key + "\ud800")
    tenanted = declare(registry, Loose, "faithful.sur-tenant", tenant=lambda i: "org\udc00")
    for call, field in [
        (lambda: plain.enqueue(Loose(key="k", anything=f"{SECRET}\ud83d")), "$.anything"),
        (lambda: plain.enqueue(Loose(key="k", mapping={"\udfff": 1})), "$.mapping"),
        (lambda: plain.enqueue(Loose(key=f"{SECRET}\ud800")), "$.key"),
        (lambda: keyed.enqueue(Loose(key=SECRET)), "idempotency_key"),
        (lambda: tenanted.enqueue(Loose(key=SECRET)), "tenant_id"),
        (lambda: plain.enqueue(Loose(key="k"), queue="q\ud800"), "queue"),
        (lambda: plain.enqueue(Loose(key="k"), tenant_id="org\ud800"), "tenant_id"),
        (lambda: plain.enqueue_as(Actor("user\ud800", None), Loose(key="k")), "enqueued_by"),
        (lambda: plain.enqueue_many([Loose(key="ok"), Loose(key="\ud800")]), "$.key"),
    ]:
        with pytest.raises(JobInputInvalidError) as caught:
            await call()
        error = caught.value
        assert error.code == "X_JOB_INPUT_INVALID", field
        assert error.meta.get("path", error.meta.get("field")) == field
        assert "lone surrogate" in str(error)
        assert SECRET not in str(error)
    assert await rows(driver) == 0
    # A character past the Basic Multilingual Plane is not a lone surrogate: it is stored.
    await plain.enqueue(Loose(key="emoji", anything="ok \U0001f600"))
    assert (await stored_and_parsed(driver, plain))[1].anything == "ok \U0001f600"


async def test_a_key_that_is_not_text_is_refused_without_quoting_it(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    class Order(BaseModel):
        number: int

    numbered = job(
        input=Order,
        idempotency_key=lambda o: o.number,  # type: ignore[arg-type, return-value]
        tenant="none",
        name="faithful.int-key",
        registry=registry,
    )(_noop)
    with pytest.raises(IdempotencyRequiredError) as caught:
        await numbered.enqueue(Order(number=987_654_321))
    assert "987654321" not in str(caught.value)
    assert "a value of type int" in str(caught.value)


# --- refusals that name the cause ----------------------------------------------------------


async def test_nesting_past_the_limit_is_refused_with_the_path_and_the_cause(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    loose = declare(registry, Loose, "faithful.deep")
    for levels in (MAX_JSON_DEPTH, 10_000):
        deep: dict[str, Any] = {}
        cursor = deep
        for _ in range(levels):
            cursor["a"] = {}
            cursor = cursor["a"]
        with pytest.raises(JobInputInvalidError) as caught:
            await loose.enqueue(Loose(key="k", anything=deep))
        error = caught.value
        assert f"nested deeper than {MAX_JSON_DEPTH} levels" in str(error), levels
        assert error.meta["path"].startswith("$.anything.a.a")
        assert "ValueError" not in str(error) and "RecursionError" not in str(error)
    fits: dict[str, Any] = {}
    cursor = fits
    for _ in range(MAX_JSON_DEPTH - 3):
        cursor["a"] = {}
        cursor = cursor["a"]
    await loose.enqueue(Loose(key="fits", anything=fits))
    assert await rows(driver) == 1


async def test_bytes_that_are_not_utf8_are_refused_with_the_path_and_the_byte(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    raw = declare(registry, Raw, "faithful.bytes")
    with pytest.raises(JobInputInvalidError) as caught:
        await raw.enqueue(Raw(key="k", blob=b"ok\xff\xfe"))
    error = caught.value
    assert error.meta["path"] == "$.blob"
    assert "not UTF-8 at byte 2" in str(error)
    assert "UnicodeDecodeError" not in str(error)
    assert await rows(driver) == 0


def test_the_batch_limit_is_unchanged() -> None:
    assert MAX_ENQUEUE_BATCH == 10_000
