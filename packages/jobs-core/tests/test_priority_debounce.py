"""Priorities and debounce through the job API: options, validation, refusals, a real burst."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from jobs_conformance.suite.test_debounce import burst_of_edits
from jobs_core import JobRegistry, job, use_driver
from jobs_core.driver import capability
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import (
    JobDeclarationInvalidError,
    JobOptionsInvalidError,
    NotImplementedByDriverError,
)
from jobs_core.types import ClaimRequest


class Doc(BaseModel):
    doc: str
    v: int = 0


def _job(registry: JobRegistry, **options: Any) -> Any:
    @job(
        input=Doc,
        idempotency_key=lambda i: f"doc:{i.doc}",
        tenant="none",
        name="tests.doc",
        registry=registry,
        **options,
    )
    async def save(input: Doc) -> None:
        return None

    return save


async def _claim_keys(driver: MemoryDriver, limit: int = 10) -> list[str]:
    claimed = await driver.claim(ClaimRequest(["default"], limit, 30_000, "w1"))
    return [c.idempotency_key for c in claimed]


async def test_declared_priority_is_the_default_and_enqueue_overrides_it() -> None:
    driver = MemoryDriver()
    registry = JobRegistry()
    save = _job(registry, priority=7)
    assert save.priority == 7 and save.describe()["priority"] == 7
    with use_driver(driver):
        plain = await save.enqueue(Doc(doc="a"))
        urgent = await save.enqueue(Doc(doc="b"), priority=-1)
        many = await save.enqueue_many([Doc(doc="c"), Doc(doc="d")], priority=3)
    infos = [await driver.introspect.get(r.id) for r in (plain, urgent, *many)]
    assert [i.priority for i in infos if i is not None] == [7, -1, 3, 3]
    assert await _claim_keys(driver) == ["doc:b", "doc:c", "doc:d", "doc:a"]


@pytest.mark.parametrize("bad", [-32769, 32768, 1.5, "1", True])
async def test_a_bad_priority_is_refused_naming_the_field(bad: Any) -> None:
    registry = JobRegistry()
    save = _job(registry)
    driver = MemoryDriver()
    with use_driver(driver), pytest.raises(JobOptionsInvalidError) as raised:
        await save.enqueue(Doc(doc="a"), priority=bad)
    assert driver.live_count() == 0
    assert raised.value.code == "X_JOB_OPTIONS_INVALID"
    assert raised.value.meta["option"] == "priority"
    assert "priority" in str(raised.value)


def test_a_bad_declared_priority_is_a_declaration_error() -> None:
    with pytest.raises(JobDeclarationInvalidError) as raised:
        _job(JobRegistry(), priority=40_000)
    assert raised.value.code == "X_JOB_DECLARATION_INVALID"
    assert any(p.startswith("priority:") for p in raised.value.meta["problems"])


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"debounce": "0s"}, "debounce"),
        ({"debounce": "soon"}, "debounce"),
        ({"debounce_max": "1m"}, "debounce_max"),
        ({"debounce": "30s", "debounce_max": "10s"}, "debounce_max"),
        ({"debounce": "30s", "delay": "1s"}, "debounce"),
        ({"debounce": "30s", "on_conflict": "error"}, "debounce"),
    ],
)
async def test_bad_debounce_options_are_refused(options: dict[str, Any], option: str) -> None:
    save = _job(JobRegistry())
    driver = MemoryDriver()
    with use_driver(driver), pytest.raises(JobOptionsInvalidError) as raised:
        await save.enqueue(Doc(doc="a"), **options)
    assert raised.value.meta["option"] == option
    assert driver.live_count() == 0


class _Plain(MemoryDriver):
    """A driver declaring neither flag: what a third-party driver unaware of them looks like."""

    capabilities = MemoryDriver.capabilities - {"priority", "debounce"}


async def test_a_driver_without_the_flags_refuses_rather_than_drops() -> None:
    save = _job(JobRegistry())
    driver = _Plain()
    assert capability(driver, "priority") is None
    assert capability(MemoryDriver(), "priority") is True
    with use_driver(driver):
        for options in ({"priority": 1}, {"debounce": "1s"}):
            with pytest.raises(NotImplementedByDriverError) as raised:
                await save.enqueue(Doc(doc="a"), **options)
            assert raised.value.code == "X_NOT_IMPLEMENTED"
        with pytest.raises(NotImplementedByDriverError):
            await save.enqueue_many([Doc(doc="a")], priority=2)
        assert not (await save.enqueue(Doc(doc="a"), priority=0)).deduped
    assert driver.live_count() == 1


async def test_a_debounced_enqueue_through_the_handle_replaces_the_input() -> None:
    save = _job(JobRegistry())
    driver = MemoryDriver()
    with use_driver(driver):
        first = await save.enqueue(Doc(doc="a", v=1), debounce="30s", debounce_max="2m")
        second = await save.enqueue(Doc(doc="a", v=2), debounce="30s")
    assert (second.id, second.deduped) == (first.id, True)
    info = await driver.introspect.get(first.id)
    assert info is not None and info.input == {"doc": "a", "v": 2}
    assert info.state.value == "delayed"


@pytest.mark.slow
async def test_a_burst_of_100_edits_on_a_real_clock_memory_driver() -> None:
    """The debounce must-show on the memory driver (``pytest -m slow -k burst -s``)."""
    driver = MemoryDriver()

    async def release(_: Any) -> None:
        await driver.close()

    delay = await burst_of_edits(driver, release)
    assert delay <= 2.1
