"""Enqueue through a job handle on the real memory driver: ids, dedupe, validation, timing, tenancy.

Every refusal is checked to write nothing (the driver's own counts), since the spec promises each
is raised "before anything is written".
"""

from __future__ import annotations

import asyncio
import json
import math
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel

from jobs_core import (
    MAX_ENQUEUE_BATCH,
    Actor,
    JobRegistry,
    JobState,
    Retry,
    _current,
    acting_as,
    cross_tenant,
    job,
    use_driver,
)
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import (
    CrossTenantForbiddenError,
    DriverUnavailableError,
    EnqueueBatchTooLargeError,
    IdempotencyRequiredError,
    JobDuplicateError,
    JobInputInvalidError,
    JobOptionsInvalidError,
    TenantMismatchError,
    TenantRequiredError,
)
from jobs_core.testing import ManualClock

CROSS = frozenset({"tenancy:cross"})


class Signup(BaseModel):
    org_id: str
    email: str
    note: str = ""
    labels: dict[str, str] = {}


def signup(org: str = "org-a", email: str = "a@example.com", **extra: Any) -> Signup:
    return Signup(org_id=org, email=email, **extra)


async def _noop(input: Any, step: Any, ctx: Any) -> None:
    return None


def declare(registry: JobRegistry, name: str, **options: Any) -> Any:
    """A Signup job whose key omits the org (so tenancy alone separates two orgs' rows)."""
    fields: dict[str, Any] = {
        "input": Signup,
        "idempotency_key": lambda i: f"signup:{i.email}",
        "tenant": lambda i: i.org_id,
    }
    fields.update(options)
    return job(**fields, name=name, registry=registry)(_noop)


@pytest.fixture
def signup_job(registry: JobRegistry) -> Any:
    return declare(registry, "enq.signup")


async def total_rows(driver: MemoryDriver) -> int:
    """Every row the driver holds, live or finished."""
    return sum(
        s.ready + s.delayed + s.running + s.suspended + s.done + s.failed + s.dead + s.cancelled
        for s in await driver.stats()
    )


async def row(driver: MemoryDriver, job_id: UUID) -> Any:
    info = await driver.introspect.get(job_id)
    assert info is not None, f"no row {job_id}"
    return info


# --- ids, the written row, dedupe ----------------------------------------------------------


async def test_enqueue_answers_the_ids_of_the_row_it_wrote(
    driver: MemoryDriver, clock: ManualClock, signup_job: Any
) -> None:
    result = await signup_job.enqueue(signup(note="hi"))
    assert isinstance(result.id, UUID)
    assert isinstance(result.run_id, UUID)
    assert result.id != result.run_id
    assert result.deduped is False
    info = await row(driver, result.id)
    assert info.run_id == result.run_id
    assert info.name == "enq.signup"
    assert info.queue == "default"
    assert info.state is JobState.READY
    assert info.tenant_id == "org-a"
    assert info.idempotency_key == "signup:a@example.com"
    assert info.input == {"org_id": "org-a", "email": "a@example.com", "note": "hi", "labels": {}}
    assert info.max_attempts == 3
    assert info.run_at == clock.now()
    assert info.enqueued_by is None
    assert driver.live_count() == 1


async def test_enqueue_accepts_raw_input_a_run_id_and_a_queue(
    driver: MemoryDriver, signup_job: Any
) -> None:
    run_id = UUID(int=42)
    result = await signup_job.enqueue(
        {"org_id": "org-a", "email": "raw@example.com"}, run_id=run_id, queue="priority"
    )
    assert result.run_id == run_id
    info = await row(driver, result.id)
    assert info.queue == "priority"
    assert info.input["email"] == "raw@example.com"
    assert [s.queue for s in await driver.stats()] == ["priority"]


async def test_compensating_job_rows_carry_the_unwind_margin(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    handle = declare(registry, "enq.compensating", retry=Retry(attempts=4), compensates=True)
    result = await handle.enqueue(signup())
    assert (await row(driver, result.id)).max_attempts == 6


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"queue": ""}, "queue"),
        ({"run_id": "not-a-uuid"}, "run_id"),
        ({"tenant_id": ""}, "tenant_id"),
        ({"on_conflict": "replace"}, "on_conflict"),
    ],
)
async def test_bad_enqueue_options_are_refused(
    driver: MemoryDriver, signup_job: Any, options: dict[str, Any], option: str
) -> None:
    with pytest.raises(JobOptionsInvalidError) as caught:
        await signup_job.enqueue(signup(), **options)
    assert caught.value.code == "X_JOB_OPTIONS_INVALID"
    assert caught.value.meta["option"] == option
    assert await total_rows(driver) == 0


async def test_a_live_key_dedupes_to_the_live_rows_ids(
    driver: MemoryDriver, signup_job: Any
) -> None:
    first = await signup_job.enqueue(signup(note="first"))
    second = await signup_job.enqueue(signup(note="second"))
    assert second.deduped is True
    assert (second.id, second.run_id) == (first.id, first.run_id)
    assert driver.live_count() == 1
    assert (await row(driver, first.id)).input["note"] == "first"


async def test_a_delayed_live_row_dedupes_too(driver: MemoryDriver, signup_job: Any) -> None:
    first = await signup_job.enqueue(signup(), delay="1h")
    second = await signup_job.enqueue(signup())
    assert second.deduped is True
    assert second.id == first.id


async def test_a_finished_row_does_not_block_a_new_enqueue(
    driver: MemoryDriver, signup_job: Any
) -> None:
    first = await signup_job.enqueue(signup())
    await driver.introspect.cancel(first.id, "test")
    again = await signup_job.enqueue(signup())
    assert again.deduped is False
    assert again.id != first.id
    assert (await row(driver, first.id)).state is JobState.CANCELLED
    assert (await row(driver, again.id)).state is JobState.READY


async def test_on_conflict_error_raises_and_writes_nothing(
    driver: MemoryDriver, signup_job: Any
) -> None:
    first = await signup_job.enqueue(signup())
    with pytest.raises(JobDuplicateError) as caught:
        await signup_job.enqueue(signup(note="other"), on_conflict="error")
    assert caught.value.code == "X_JOB_DUPLICATE"
    assert caught.value.meta["id"] == str(first.id)
    assert caught.value.meta["run_id"] == str(first.run_id)
    assert await total_rows(driver) == 1
    assert (await row(driver, first.id)).input["note"] == ""


async def test_on_conflict_error_without_a_conflict_inserts(
    driver: MemoryDriver, signup_job: Any
) -> None:
    result = await signup_job.enqueue(signup(), on_conflict="error")
    assert result.deduped is False
    assert driver.live_count() == 1


async def test_two_tenants_with_one_key_are_two_rows(driver: MemoryDriver, signup_job: Any) -> None:
    a = await signup_job.enqueue(signup("org-a", "same@example.com"))
    b = await signup_job.enqueue(signup("org-b", "same@example.com"))
    assert not a.deduped and not b.deduped
    assert a.id != b.id
    assert (await row(driver, a.id)).tenant_id == "org-a"
    assert (await row(driver, b.id)).tenant_id == "org-b"
    assert (await row(driver, a.id)).idempotency_key == (await row(driver, b.id)).idempotency_key
    assert driver.live_count() == 2


async def test_two_jobs_with_one_key_are_two_rows(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    one = declare(registry, "enq.one")
    two = declare(registry, "enq.two")
    a = await one.enqueue(signup())
    b = await two.enqueue(signup())
    assert a.id != b.id
    assert not b.deduped


# --- input validation ---------------------------------------------------------------------


@pytest.mark.parametrize("empty", ["", None, 7])
async def test_an_empty_idempotency_key_at_enqueue_is_refused(
    driver: MemoryDriver, registry: JobRegistry, empty: Any
) -> None:
    handle = declare(registry, "enq.empty-key", idempotency_key=lambda i: empty)
    with pytest.raises(IdempotencyRequiredError) as caught:
        await handle.enqueue(signup())
    assert caught.value.code == "X_IDEMPOTENCY_REQUIRED"
    assert await total_rows(driver) == 0


async def test_an_empty_tenant_at_enqueue_is_refused(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    handle = declare(registry, "enq.empty-tenant", tenant=lambda i: "")
    with pytest.raises(TenantRequiredError):
        await handle.enqueue(signup())
    assert await total_rows(driver) == 0


async def test_input_that_fails_the_model_lists_issues_without_the_payload(
    driver: MemoryDriver, signup_job: Any
) -> None:
    secret = "SECRET-TOKEN-8c1f"
    with pytest.raises(JobInputInvalidError) as caught:
        await signup_job.enqueue({"org_id": "org-a", "labels": secret})
    error = caught.value
    assert error.code == "X_JOB_INPUT_INVALID"
    locs = sorted(tuple(issue["loc"]) for issue in error.meta["issues"])
    assert locs == [("email",), ("labels",)]
    assert all(issue["msg"] for issue in error.meta["issues"])
    assert "email" in str(error)
    assert "labels" in str(error)
    assert secret not in str(error)
    assert secret not in json.dumps(error.meta)
    assert await total_rows(driver) == 0


async def test_input_of_the_wrong_type_entirely_is_refused(
    driver: MemoryDriver, signup_job: Any
) -> None:
    with pytest.raises(JobInputInvalidError) as caught:
        await signup_job.enqueue("SECRET-not-a-signup")
    assert "SECRET-not-a-signup" not in str(caught.value)
    assert await total_rows(driver) == 0


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"org_id": "org-a", "email": "a\x00b"}, "$.email"),
        ({"org_id": "org-a", "email": "e", "labels": {"k\x00": "v"}}, "$.labels"),
        ({"org_id": "org-a", "email": "e", "labels": {"k": "v\x00"}}, "$.labels.k"),
    ],
)
async def test_c22_nul_in_input_is_refused_before_anything_is_written(
    driver: MemoryDriver, signup_job: Any, value: dict[str, Any], path: str
) -> None:
    with pytest.raises(JobInputInvalidError) as caught:
        await signup_job.enqueue(value)
    assert caught.value.code == "X_JOB_INPUT_INVALID"
    assert caught.value.meta["path"] == path
    assert "U+0000" in str(caught.value)
    assert await total_rows(driver) == 0


async def test_c22_nul_in_key_tenant_queue_or_actor_is_refused_before_anything_is_written(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    # PostgreSQL text columns refuse U+0000 too, so every driver must see the same refusal.
    nul_key = declare(registry, "enq.nul-key", idempotency_key=lambda i: "k\x00" + i.email)
    with pytest.raises(IdempotencyRequiredError) as key_error:
        await nul_key.enqueue(signup())
    assert "U+0000" in str(key_error.value)
    nul_tenant = declare(registry, "enq.nul-tenant", tenant=lambda i: i.org_id + "\x00")
    with pytest.raises(TenantRequiredError):
        await nul_tenant.enqueue(signup())
    plain = declare(registry, "enq.nul-options")
    no_tenant = declare(registry, "enq.nul-options-none", tenant="none")
    for call, option in [
        (lambda: plain.enqueue(signup(), queue="q\x00"), "queue"),
        (lambda: plain.enqueue(signup(), tenant_id="org-a\x00"), "tenant_id"),
        (lambda: no_tenant.enqueue(signup(), tenant_id="org\x00"), "tenant_id"),
        (lambda: plain.enqueue_as(Actor("u\x00", "org-a"), signup()), "actor"),
        (lambda: no_tenant.enqueue_as(Actor("u", "org\x00"), signup()), "actor"),
        (lambda: plain.enqueue_many([signup()], queue="\x00"), "queue"),
    ]:
        with pytest.raises(JobOptionsInvalidError) as caught:
            await call()
        assert caught.value.meta["option"] == option
    with acting_as(Actor("ambient\x00", "org-a")), pytest.raises(JobOptionsInvalidError):
        await plain.enqueue(signup())
    assert await total_rows(driver) == 0


# --- timing (C24) -------------------------------------------------------------------------


async def test_delay_delays_the_row(
    driver: MemoryDriver, clock: ManualClock, signup_job: Any
) -> None:
    result = await signup_job.enqueue(signup(), delay="30s")
    info = await row(driver, result.id)
    assert info.state is JobState.DELAYED
    assert info.run_at == clock.now() + timedelta(seconds=30)
    other = await signup_job.enqueue(signup(email="b@x"), delay=timedelta(minutes=2))
    assert (await row(driver, other.id)).run_at == clock.now() + timedelta(minutes=2)
    ms = await signup_job.enqueue(signup(email="c@x"), delay=1500)
    assert (await row(driver, ms.id)).run_at == clock.now() + timedelta(milliseconds=1500)


async def test_zero_delay_is_ready_now(
    driver: MemoryDriver, clock: ManualClock, signup_job: Any
) -> None:
    result = await signup_job.enqueue(signup(), delay=0)
    info = await row(driver, result.id)
    assert info.state is JobState.READY
    assert info.run_at == clock.now()


@pytest.mark.parametrize(
    "delay",
    [
        -1,
        "-1s",
        timedelta(days=-1),
        -(int(datetime(2030, 1, 1, tzinfo=UTC).timestamp() * 1000) + 1),
        -0.5,
        timedelta(microseconds=-1),
        math.nan,
        math.inf,
        -math.inf,
        10**18,
        True,
        "soon",
        [5],
    ],
)
async def test_c24_bad_delays_are_refused_and_write_nothing(
    driver: MemoryDriver, signup_job: Any, delay: Any
) -> None:
    with pytest.raises(JobOptionsInvalidError) as caught:
        await signup_job.enqueue(signup(), delay=delay)
    assert caught.value.code == "X_JOB_OPTIONS_INVALID"
    assert caught.value.meta["option"] == "delay"
    assert "delay" in str(caught.value)
    assert await total_rows(driver) == 0


@pytest.mark.parametrize(
    "run_at",
    [
        datetime(2030, 6, 1),  # naive
        "2030-06-01T00:00:00Z",
        1_900_000_000,
    ],
)
async def test_run_at_must_be_an_aware_datetime(
    driver: MemoryDriver, signup_job: Any, run_at: Any
) -> None:
    with pytest.raises(JobOptionsInvalidError) as caught:
        await signup_job.enqueue(signup(), run_at=run_at)
    assert caught.value.meta["option"] == "run_at"
    assert await total_rows(driver) == 0


@pytest.mark.parametrize(
    "past",
    [
        datetime(2029, 12, 31, 23, 59, tzinfo=UTC),
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(1969, 7, 20, tzinfo=UTC),
        datetime(1, 1, 1, tzinfo=UTC),
    ],
)
async def test_c24_a_past_run_at_runs_now(
    driver: MemoryDriver, clock: ManualClock, signup_job: Any, past: datetime
) -> None:
    result = await signup_job.enqueue(signup(), run_at=past)
    info = await row(driver, result.id)
    assert info.state is JobState.READY
    assert info.run_at == clock.now()
    assert (await driver.stats())[0].ready == 1
    assert driver.next_due_at() == clock.now()


@pytest.mark.parametrize(
    "ahead",
    [timedelta(seconds=1), timedelta(days=3), timedelta(days=365 * 50)],
)
async def test_a_future_run_at_is_delayed(
    driver: MemoryDriver, clock: ManualClock, signup_job: Any, ahead: timedelta
) -> None:
    when = clock.now() + ahead
    result = await signup_job.enqueue(signup(), run_at=when)
    info = await row(driver, result.id)
    assert info.state is JobState.DELAYED
    assert info.run_at == when
    assert (await driver.stats())[0].delayed == 1


async def test_c24_a_run_at_in_year_9999_is_delayed_not_broken(
    driver: MemoryDriver, signup_job: Any
) -> None:
    when = datetime(9999, 12, 31, 23, 59, tzinfo=UTC)
    result = await signup_job.enqueue(signup(), run_at=when)
    info = await row(driver, result.id)
    assert info.state is JobState.DELAYED
    assert info.run_at == when
    assert driver.next_due_at() == when


async def test_run_at_in_another_zone_is_the_same_instant(
    driver: MemoryDriver, clock: ManualClock, signup_job: Any
) -> None:
    when = datetime(2030, 1, 1, 5, 0, tzinfo=timezone(timedelta(hours=3)))  # 02:00 UTC
    result = await signup_job.enqueue(signup(), run_at=when)
    info = await row(driver, result.id)
    assert info.run_at == when
    assert info.run_at - clock.now() == timedelta(hours=2)


async def test_run_at_and_delay_together_are_refused(
    driver: MemoryDriver, clock: ManualClock, signup_job: Any
) -> None:
    with pytest.raises(JobOptionsInvalidError) as caught:
        await signup_job.enqueue(signup(), run_at=clock.now() + timedelta(hours=1), delay="1s")
    assert "exclusive" in str(caught.value)
    assert await total_rows(driver) == 0


# --- no driver ----------------------------------------------------------------------------


@pytest.fixture
def no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_current, "_installed", None)
    assert _current._context_driver.get() is None


async def test_enqueue_without_a_driver_is_refused(no_driver: None, signup_job: Any) -> None:
    with pytest.raises(DriverUnavailableError) as caught:
        await signup_job.enqueue(signup())
    assert caught.value.code == "X_DRIVER_UNAVAILABLE"
    with pytest.raises(DriverUnavailableError):
        await signup_job.enqueue_many([signup()])
    with pytest.raises(DriverUnavailableError):
        await signup_job.enqueue_as(Actor("u", "org-a"), signup())


def test_enqueue_sync_without_a_driver_is_refused(no_driver: None, signup_job: Any) -> None:
    with pytest.raises(DriverUnavailableError):
        signup_job.enqueue_sync(signup())


async def test_a_process_wide_driver_serves_when_no_context_driver_is_set(
    no_driver: None, signup_job: Any
) -> None:
    mem = MemoryDriver()
    _current.install_driver(mem)
    try:
        result = await signup_job.enqueue(signup())
    finally:
        _current.install_driver(None)
    assert (await row(mem, result.id)).tenant_id == "org-a"


# --- enqueue_many -------------------------------------------------------------------------


async def test_enqueue_many_answers_in_input_order(driver: MemoryDriver, signup_job: Any) -> None:
    inputs = [signup(email=f"u{i}@x") for i in range(7)]
    results = await signup_job.enqueue_many(inputs)
    assert len(results) == 7
    assert len({r.id for r in results}) == 7
    for i, result in enumerate(results):
        assert result.deduped is False
        info = await row(driver, result.id)
        assert info.input["email"] == f"u{i}@x"
        assert info.run_id == result.run_id
    assert driver.live_count() == 7


async def test_enqueue_many_dedupes_within_the_batch_and_against_live_rows(
    driver: MemoryDriver, signup_job: Any
) -> None:
    live = await signup_job.enqueue(signup(email="live@x"))
    results = await signup_job.enqueue_many(
        [signup(email="a@x"), signup(email="b@x"), signup(email="a@x"), signup(email="live@x")]
    )
    assert [r.deduped for r in results] == [False, False, True, True]
    assert (results[2].id, results[2].run_id) == (results[0].id, results[0].run_id)
    assert results[3].id == live.id
    assert driver.live_count() == 3


async def test_enqueue_many_accepts_any_iterable_and_options(
    driver: MemoryDriver, clock: ManualClock, signup_job: Any
) -> None:
    results = await signup_job.enqueue_many(
        (signup(email=f"g{i}@x") for i in range(3)), delay="1m", queue="bulk"
    )
    for result in results:
        info = await row(driver, result.id)
        assert info.state is JobState.DELAYED
        assert info.queue == "bulk"
        assert info.run_at == clock.now() + timedelta(minutes=1)


async def test_enqueue_many_of_nothing_answers_nothing(
    driver: MemoryDriver, signup_job: Any
) -> None:
    assert await signup_job.enqueue_many([]) == []
    assert await total_rows(driver) == 0


async def test_enqueue_many_refuses_more_than_the_batch_limit(
    driver: MemoryDriver, signup_job: Any
) -> None:
    assert MAX_ENQUEUE_BATCH == 10_000
    too_many = ({"org_id": "org-a", "email": f"{i}@x"} for i in range(MAX_ENQUEUE_BATCH + 1))
    with pytest.raises(EnqueueBatchTooLargeError) as caught:
        await signup_job.enqueue_many(too_many)
    assert caught.value.code == "X_JOB_ENQUEUE_BATCH_TOO_LARGE"
    assert caught.value.meta["count"] == MAX_ENQUEUE_BATCH + 1
    assert await total_rows(driver) == 0


async def test_enqueue_many_takes_exactly_the_batch_limit(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    handle = job(
        input=int,
        idempotency_key=lambda i: f"n:{i}",
        tenant="none",
        name="enq.bulk-int",
        registry=registry,
    )(_noop)
    results = await handle.enqueue_many(range(MAX_ENQUEUE_BATCH))
    assert len(results) == MAX_ENQUEUE_BATCH
    assert driver.live_count() == MAX_ENQUEUE_BATCH
    assert (await row(driver, results[-1].id)).input == MAX_ENQUEUE_BATCH - 1


async def test_enqueue_many_refuses_on_conflict_error(
    driver: MemoryDriver, signup_job: Any
) -> None:
    with pytest.raises(JobOptionsInvalidError) as caught:
        await signup_job.enqueue_many([signup()], on_conflict="error")
    assert caught.value.code == "X_JOB_OPTIONS_INVALID"
    assert caught.value.meta["option"] == "on_conflict"
    assert await total_rows(driver) == 0


@pytest.mark.parametrize(
    ("bad", "error_type"),
    [
        ({"org_id": "org-a"}, JobInputInvalidError),
        ({"org_id": "org-a", "email": "nul\x00"}, JobInputInvalidError),
        ({"org_id": "org-a", "email": ""}, IdempotencyRequiredError),
        ({"org_id": "", "email": "e@x"}, TenantRequiredError),
    ],
)
async def test_a_bad_input_at_index_i_fails_the_whole_batch_and_writes_nothing(
    driver: MemoryDriver, registry: JobRegistry, bad: dict[str, Any], error_type: type
) -> None:
    handle = declare(registry, "enq.batch-bad", idempotency_key=lambda i: i.email)
    inputs: list[Any] = [signup(email=f"ok{i}@x") for i in range(5)]
    inputs.insert(3, bad)
    with pytest.raises(error_type) as caught:
        await handle.enqueue_many(inputs)
    assert caught.value.meta["index"] == 3
    assert await total_rows(driver) == 0
    assert await driver.stats() == []


async def test_a_bad_batch_option_is_refused_before_any_write(
    driver: MemoryDriver, signup_job: Any
) -> None:
    with pytest.raises(JobOptionsInvalidError) as caught:
        await signup_job.enqueue_many([signup(), signup(email="b@x")], delay=-5)
    assert caught.value.meta["option"] == "delay"
    assert await total_rows(driver) == 0


# --- enqueue_sync -------------------------------------------------------------------------


def test_enqueue_sync_from_plain_sync_code(registry: JobRegistry) -> None:
    handle = declare(registry, "enq.sync")
    mem = MemoryDriver()
    with use_driver(mem):
        first = handle.enqueue_sync(signup(), delay="5s")
        again = handle.enqueue_sync(signup())
    assert first.deduped is False
    assert again.deduped is True
    assert again.id == first.id
    info = asyncio.run(mem.introspect.get(first.id))
    assert info is not None
    assert info.state is JobState.DELAYED
    assert info.tenant_id == "org-a"
    assert mem.live_count() == 1


def test_enqueue_sync_on_conflict_error(registry: JobRegistry) -> None:
    handle = declare(registry, "enq.sync-conflict")
    mem = MemoryDriver()
    with use_driver(mem):
        handle.enqueue_sync(signup())
        with pytest.raises(JobDuplicateError):
            handle.enqueue_sync(signup(), on_conflict="error")
    assert mem.live_count() == 1


async def test_enqueue_sync_inside_a_running_loop_raises(
    driver: MemoryDriver, signup_job: Any, recwarn: pytest.WarningsRecorder
) -> None:
    with pytest.raises(RuntimeError, match="running event loop") as raised:
        signup_job.enqueue_sync(signup())
    # It names the async twin to await instead.
    assert "await JobHandle.enqueue(...)" in str(raised.value)
    assert await total_rows(driver) == 0
    # The coroutine was closed, not leaked un-awaited.
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


# --- tenancy ------------------------------------------------------------------------------


async def test_no_stated_tenant_stamps_tenant_of_input(
    driver: MemoryDriver, signup_job: Any
) -> None:
    result = await signup_job.enqueue(signup("org-z"))
    assert (await row(driver, result.id)).tenant_id == "org-z"


async def test_an_explicit_matching_tenant_is_accepted(
    driver: MemoryDriver, signup_job: Any
) -> None:
    result = await signup_job.enqueue(signup("org-a"), tenant_id="org-a")
    assert (await row(driver, result.id)).tenant_id == "org-a"


async def test_explicit_tenant_mismatch_writes_nothing(
    driver: MemoryDriver, signup_job: Any
) -> None:
    with pytest.raises(TenantMismatchError) as caught:
        await signup_job.enqueue(signup("org-a"), tenant_id="org-b")
    assert caught.value.code == "X_JOB_TENANT_MISMATCH"
    assert caught.value.meta["form"] == "explicit"
    with pytest.raises(TenantMismatchError) as many:
        await signup_job.enqueue_many(
            [signup("org-b", "x@x"), signup("org-a", "y@x")], tenant_id="org-b"
        )
    assert many.value.meta["form"] == "explicit"
    assert many.value.meta["index"] == 1
    assert await total_rows(driver) == 0


async def test_enqueue_as_an_actor_of_another_org_writes_nothing(
    driver: MemoryDriver, signup_job: Any
) -> None:
    with pytest.raises(TenantMismatchError) as caught:
        await signup_job.enqueue_as(Actor("user-b", "org-b"), signup("org-a"))
    assert caught.value.meta["form"] == "enqueue_as"
    assert await total_rows(driver) == 0


async def test_ambient_actor_of_another_org_writes_nothing(
    driver: MemoryDriver, signup_job: Any
) -> None:
    with acting_as(Actor("user-b", "org-b")):
        with pytest.raises(TenantMismatchError) as caught:
            await signup_job.enqueue(signup("org-a"))
        assert caught.value.meta["form"] == "ambient"
        with pytest.raises(TenantMismatchError) as many:
            await signup_job.enqueue_many([signup("org-b", "b@x"), signup("org-a")])
        assert many.value.meta["form"] == "ambient"
        assert many.value.meta["index"] == 1
        # Stating the input's org explicitly does not waive the ambient check.
        with pytest.raises(TenantMismatchError):
            await signup_job.enqueue(signup("org-a"), tenant_id="org-a")
    assert await total_rows(driver) == 0


async def test_ambient_actor_of_the_same_org_is_attributed(
    driver: MemoryDriver, signup_job: Any
) -> None:
    with acting_as(Actor("user-a", "org-a")):
        result = await signup_job.enqueue(signup("org-a"))
    info = await row(driver, result.id)
    assert info.tenant_id == "org-a"
    assert info.enqueued_by == "user-a"


async def test_the_ambient_check_follows_tasks(driver: MemoryDriver, signup_job: Any) -> None:
    with acting_as(Actor("user-b", "org-b")):
        task = asyncio.ensure_future(signup_job.enqueue(signup("org-a")))
    with pytest.raises(TenantMismatchError):
        await task
    assert await total_rows(driver) == 0


async def test_enqueue_as_sets_tenant_and_enqueued_by(
    driver: MemoryDriver, signup_job: Any
) -> None:
    result = await signup_job.enqueue_as(Actor("user-a", "org-a"), signup("org-a"), delay="1s")
    info = await row(driver, result.id)
    assert info.enqueued_by == "user-a"
    assert info.tenant_id == "org-a"
    assert info.state is JobState.DELAYED


async def test_enqueue_as_dedupes_and_honours_on_conflict(
    driver: MemoryDriver, signup_job: Any
) -> None:
    actor = Actor("user-a", "org-a")
    first = await signup_job.enqueue_as(actor, signup())
    again = await signup_job.enqueue_as(actor, signup())
    assert again.deduped and again.id == first.id
    with pytest.raises(JobDuplicateError):
        await signup_job.enqueue_as(actor, signup(), on_conflict="error")


async def test_cross_tenant_admits_only_the_ambient_case(
    driver: MemoryDriver, signup_job: Any
) -> None:
    support = Actor("support-1", "org-b", permissions=CROSS)
    with acting_as(support), cross_tenant("ticket 4711: resend org-a signups"):
        crossed = await signup_job.enqueue(signup("org-a"))
        many = await signup_job.enqueue_many([signup("org-a", "m@x"), signup("org-c", "n@x")])
        with pytest.raises(TenantMismatchError) as explicit:
            await signup_job.enqueue(signup("org-a", "e@x"), tenant_id="org-b")
        assert explicit.value.meta["form"] == "explicit"
        with pytest.raises(TenantMismatchError) as as_actor:
            await signup_job.enqueue_as(support, signup("org-a", "f@x"))
        assert as_actor.value.meta["form"] == "enqueue_as"
        with pytest.raises(TenantMismatchError):
            await signup_job.enqueue_many([signup("org-a", "g@x")], tenant_id="org-b")
    info = await row(driver, crossed.id)
    assert info.tenant_id == "org-a"  # stamped with the input's tenant, not the actor's
    assert info.enqueued_by == "support-1"
    assert [(await row(driver, r.id)).tenant_id for r in many] == ["org-a", "org-c"]
    assert driver.live_count() == 3
    # Outside the block the ambient check is back.
    with acting_as(support), pytest.raises(TenantMismatchError):
        await signup_job.enqueue(signup("org-a", "after@x"))


async def test_cross_tenant_waiver_belongs_to_the_permitted_actor(
    driver: MemoryDriver, signup_job: Any
) -> None:
    support = Actor("support-1", "org-b", permissions=CROSS)
    with acting_as(support), cross_tenant("bulk fix"):
        # Code inside the block that switches to an unpermitted actor gets no waiver.
        with acting_as(Actor("user-b", "org-b")), pytest.raises(TenantMismatchError):
            await signup_job.enqueue(signup("org-a"))
        assert (await signup_job.enqueue(signup("org-a"))).deduped is False
    assert driver.live_count() == 1


@pytest.mark.parametrize(
    ("actor", "reason"),
    [
        (None, "why"),
        (Actor("user-b", "org-b"), "why"),
        (Actor("user-b", "org-b", permissions=frozenset({"admin"})), "why"),
        (Actor("support", "org-b", permissions=CROSS), "   "),
    ],
)
async def test_cross_tenant_needs_a_permitted_actor_and_a_reason(
    driver: MemoryDriver, signup_job: Any, actor: Actor | None, reason: str
) -> None:
    with acting_as(actor):
        with pytest.raises(CrossTenantForbiddenError) as caught, cross_tenant(reason):
            pass
        assert caught.value.code == "X_TENANCY_CROSS_FORBIDDEN"
        if actor is not None and actor.org_id == "org-b":
            with pytest.raises(TenantMismatchError):
                await signup_job.enqueue(signup("org-a"))
    assert await total_rows(driver) == 0


async def test_a_tenantless_job_never_compares(driver: MemoryDriver, registry: JobRegistry) -> None:
    handle = declare(registry, "enq.no-tenant", tenant="none")
    explicit = await handle.enqueue(signup("org-a", "1@x"), tenant_id="org-z")
    with acting_as(Actor("user-b", "org-b")):
        ambient = await handle.enqueue(signup("org-a", "2@x"))
    as_actor = await handle.enqueue_as(Actor("user-c", "org-c"), signup("org-a", "3@x"))
    bare = await handle.enqueue(signup("org-a", "4@x"))
    assert (await row(driver, explicit.id)).tenant_id == "org-z"
    assert (await row(driver, ambient.id)).tenant_id is None
    assert (await row(driver, ambient.id)).enqueued_by == "user-b"
    assert (await row(driver, as_actor.id)).tenant_id == "org-c"
    assert (await row(driver, as_actor.id)).enqueued_by == "user-c"
    assert (await row(driver, bare.id)).tenant_id is None
    assert driver.live_count() == 4


async def test_actors_with_no_org_are_never_compared(driver: MemoryDriver, signup_job: Any) -> None:
    service = Actor("svc-mailer")
    as_service = await signup_job.enqueue_as(service, signup("org-a", "1@x"))
    with acting_as(service):
        ambient = await signup_job.enqueue(signup("org-b", "2@x"))
        many = await signup_job.enqueue_many([signup("org-c", "3@x")])
    assert (await row(driver, as_service.id)).tenant_id == "org-a"
    assert (await row(driver, as_service.id)).enqueued_by == "svc-mailer"
    assert (await row(driver, ambient.id)).tenant_id == "org-b"
    assert (await row(driver, many[0].id)).tenant_id == "org-c"
    assert driver.live_count() == 3


async def test_a_secret_field_reaches_the_body_in_clear_and_operators_see_it_masked(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    from pydantic import SecretStr

    from jobs_core.introspect import get_job
    from jobs_core.testing import run_jobs

    class Login(BaseModel):
        user: str
        token: SecretStr

    class Batch(BaseModel):
        logins: list[Login]

    seen: list[str] = []

    @job(
        input=Batch,
        idempotency_key=lambda i: i.logins[0].user,
        tenant="none",
        name="secret-batch",
        registry=registry,
    )
    async def body(input: Batch, step: Any, ctx: Any) -> None:
        seen.extend(login.token.get_secret_value() for login in input.logins)

    result = await body.enqueue(Batch(logins=[Login(user="ada", token=SecretStr("s3cr3t"))]))
    view = await get_job(driver, result.id, registry=registry)
    assert "s3cr3t" not in str(view)
    await run_jobs(driver, clock=clock, registry=registry)
    assert seen == ["s3cr3t"]
