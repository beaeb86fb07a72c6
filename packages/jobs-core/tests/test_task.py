"""Declaring cron tasks: refusals at declaration, the POSIX-OR warning, entries, the handle."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from jobs_core import JobRegistry, TaskRegistry, job, next_task_run, task
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import (
    DriverUnavailableError,
    EnqueueBatchTooLargeError,
    JobDeclarationInvalidError,
    JobDuplicateError,
    JobInputInvalidError,
)
from jobs_core.job import JobHandle
from jobs_core.testing import ManualClock
from jobs_core.types import JobFilter


class Digest(BaseModel):
    at: datetime


async def _noop(input: Any, step: Any, ctx: Any) -> None:
    return None


@pytest.fixture
def tasks() -> TaskRegistry:
    return TaskRegistry()


@pytest.fixture
def digest(registry: JobRegistry) -> JobHandle[Any, Any]:
    return job(
        input=Digest,
        idempotency_key=lambda i: f"digest:{i.at.isoformat()}",
        tenant="none",
        name="send-digest",
        registry=registry,
    )(_noop)


@pytest.fixture
def cleanup(registry: JobRegistry) -> JobHandle[Any, Any]:
    return job(
        input=Digest,
        idempotency_key=lambda i: f"cleanup:{i.at.isoformat()}",
        tenant="none",
        name="cleanup",
        registry=registry,
    )(_noop)


# --- declaration ------------------------------------------------------------------------------


def test_a_zone_that_is_not_iana_is_refused_naming_tz(tasks: TaskRegistry) -> None:
    with pytest.raises(JobDeclarationInvalidError) as caught:
        task(cron="0 3 * * *", tz="Bogota", enqueue=lambda at: [], name="n", registry=tasks)
    assert caught.value.code == "X_JOB_DECLARATION_INVALID"
    problems = caught.value.meta["problems"]
    assert [p.split(":")[0] for p in problems] == ["tz"]
    assert "'Bogota'" in problems[0]
    assert "America/Bogota" in caught.value.message  # the fix names a real zone
    assert tasks.all() == []


def test_every_bad_field_is_listed_at_once(tasks: TaskRegistry) -> None:
    with pytest.raises(JobDeclarationInvalidError) as caught:
        task(
            cron="0 3 * *",
            tz="Mars/Olympus",
            enqueue="not a function",  # type: ignore[arg-type]
            catch_up="sometimes",  # type: ignore[arg-type]
            max_catch_up=0,
            name="",
            registry=tasks,
        )
    fields = sorted(p.split(":")[0] for p in caught.value.meta["problems"])
    assert fields == ["catch_up", "cron", "enqueue", "max_catch_up", "name", "tz"]
    assert tasks.all() == []


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_catch_up": True}, "max_catch_up"),
        ({"max_catch_up": 2.5}, "max_catch_up"),
        ({"cron": "0 0 30 2 *"}, "cron"),  # never fires
        ({"cron": "0 3 * * * *"}, "cron"),  # a seconds field
        ({"tz": ""}, "tz"),
        ({"name": "a\x00b"}, "name"),
    ],
)
def test_single_bad_fields_are_refused(
    tasks: TaskRegistry, options: dict[str, Any], field: str
) -> None:
    fields: dict[str, Any] = {
        "cron": "0 3 * * *",
        "tz": "Europe/Paris",
        "enqueue": lambda at: [],
        "name": "t",
    }
    with pytest.raises(JobDeclarationInvalidError) as caught:
        task(**{**fields, **options}, registry=tasks)
    assert [p.split(":")[0] for p in caught.value.meta["problems"]] == [field]


def test_enqueue_must_be_a_synchronous_function_of_the_occurrence(tasks: TaskRegistry) -> None:
    async def later(at: datetime) -> list[Any]:
        return []

    def two(at: datetime, other: int) -> list[Any]:
        return []

    for bad, words in ((later, "not async"), (two, "one positional argument")):
        with pytest.raises(JobDeclarationInvalidError, match=words):
            task(cron="* * * * *", tz="UTC", enqueue=bad, registry=tasks)


def test_two_tasks_with_one_name_are_refused(tasks: TaskRegistry) -> None:
    task(cron="0 3 * * *", tz="UTC", enqueue=lambda at: [], name="nightly", registry=tasks)
    with pytest.raises(JobDuplicateError) as caught:
        task(cron="0 4 * * *", tz="UTC", enqueue=lambda at: [], name="nightly", registry=tasks)
    assert caught.value.code == "X_JOB_DUPLICATE"
    assert [t.cron for t in tasks.all()] == ["0 3 * * *"]


def test_default_names(tasks: TaskRegistry) -> None:
    def nightly_entries(at: datetime) -> list[Any]:
        return []

    named = task(cron="0 3 * * *", tz="UTC", enqueue=nightly_entries, registry=tasks)
    anonymous = task(cron="0 3 * * *", tz="Europe/Paris", enqueue=lambda at: [], registry=tasks)

    assert named.name == f"{__name__}.{nightly_entries.__qualname__}"
    assert anonymous.name == f"{__name__}:0 3 * * *@Europe/Paris"
    # Two lambdas with one cron and zone in one module collide loudly, not silently.
    with pytest.raises(JobDuplicateError, match="name="):
        task(cron="0 3 * * *", tz="Europe/Paris", enqueue=lambda at: [1], registry=tasks)


def test_both_day_fields_restricted_warns_posix_or_at_declaration(
    tasks: TaskRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="jobs.task"):
        first = task(cron="0 0 1 * 1", tz="UTC", enqueue=lambda at: [], name="or", registry=tasks)
        task(cron="0 0 1 * *", tz="UTC", enqueue=lambda at: [], name="dom", registry=tasks)
        task(cron="0 0 * * 1", tz="UTC", enqueue=lambda at: [], name="dow", registry=tasks)

    warned = [r for r in caplog.records if getattr(r, "event", None) == "jobs.task.posix-or"]
    assert [getattr(r, "task", None) for r in warned] == ["or"]
    assert warned[0].levelno == logging.WARNING
    # And it does follow POSIX OR: from Friday 2030-02-01 (the 1st) the next runs are Monday the
    # 4th, Monday the 11th ... and Friday 2030-03-01.
    runs = [datetime(2030, 1, 31, tzinfo=UTC)]
    for _ in range(6):
        runs.append(next_task_run(first, runs[-1]))
    assert [r.day for r in runs[1:]] == [1, 4, 11, 18, 25, 1]


# --- the handle -------------------------------------------------------------------------------


def test_describe_gives_cron_tz_catch_up_and_jobs(
    tasks: TaskRegistry, digest: JobHandle[Any, Any], cleanup: JobHandle[Any, Any]
) -> None:
    nightly = task(
        cron="0 3 * * *",
        tz="Europe/Paris",
        catch_up="run-all",
        max_catch_up=4,
        enqueue=lambda at: [(digest, Digest(at=at)), (cleanup, {"at": at}), (digest, {"at": at})],
        name="nightly",
        registry=tasks,
    )
    assert nightly.describe() == {
        "kind": "task",
        "name": "nightly",
        "cron": "0 3 * * *",
        "tz": "Europe/Paris",
        "catch_up": "run-all",
        "max_catch_up": 4,
        "jobs": ["cleanup", "send-digest"],
    }


def test_entries_hand_the_occurrence_in_utc_and_check_the_shape(
    tasks: TaskRegistry, digest: JobHandle[Any, Any]
) -> None:
    seen: list[datetime] = []

    def entries(at: datetime) -> list[Any]:
        seen.append(at)
        return [(digest, {"at": at})]

    t = task(cron="0 3 * * *", tz="Europe/Paris", enqueue=entries, registry=tasks)
    paris = datetime(2030, 1, 1, 3, tzinfo=t.schedule.zone)
    assert t.entries(paris) == [(digest, {"at": datetime(2030, 1, 1, 2, tzinfo=UTC)})]
    assert seen[0].tzinfo is UTC
    with pytest.raises(ValueError, match="aware"):
        t.entries(datetime(2030, 1, 1))

    bad = task(cron="0 3 * * *", tz="UTC", enqueue=lambda at: [digest], name="b", registry=tasks)
    with pytest.raises(JobDeclarationInvalidError) as caught:
        bad.entries(paris)
    assert caught.value.meta["index"] == 0
    scalar = task(cron="0 3 * * *", tz="UTC", enqueue=lambda at: "x", name="s", registry=tasks)
    with pytest.raises(JobDeclarationInvalidError, match="list of"):
        scalar.entries(paris)


def test_entries_are_bounded_by_the_enqueue_batch(
    tasks: TaskRegistry, digest: JobHandle[Any, Any]
) -> None:
    huge = task(
        cron="0 3 * * *",
        tz="UTC",
        enqueue=lambda at: ((digest, {"at": at}) for _ in range(20_000)),
        name="huge",
        registry=tasks,
    )
    with pytest.raises(EnqueueBatchTooLargeError):
        huge.entries(datetime(2030, 1, 1, tzinfo=UTC))


def test_scheduled_requests_carry_ids_derived_from_task_occurrence_and_index(
    tasks: TaskRegistry, digest: JobHandle[Any, Any], cleanup: JobHandle[Any, Any]
) -> None:
    t = task(
        cron="0 3 * * *",
        tz="UTC",
        enqueue=lambda at: [(digest, {"at": at}), (cleanup, {"at": at})],
        name="nightly",
        registry=tasks,
    )
    day1 = datetime(2030, 1, 1, 3, tzinfo=UTC)
    day2 = day1 + timedelta(days=1)
    first = t.requests(day1)
    again = t.requests(day1)
    other = t.requests(day2)

    assert [r.id for r in first] == [r.id for r in again]
    assert len({r.id for r in first + other}) == 4
    assert all(r.id.version == 7 for r in first + other)
    # Time-ordered like minted ids: a later occurrence sorts later.
    assert max(r.id for r in first) < min(r.id for r in other)
    assert [r.name for r in first] == ["send-digest", "cleanup"]
    assert first[0].idempotency_key == f"digest:{day1.isoformat()}"


def test_requests_validate_every_entry_and_name_the_bad_one(
    tasks: TaskRegistry, digest: JobHandle[Any, Any]
) -> None:
    t = task(
        cron="0 3 * * *",
        tz="UTC",
        enqueue=lambda at: [(digest, {"at": at}), (digest, {"at": "not a time"})],
        name="half-bad",
        registry=tasks,
    )
    with pytest.raises(JobInputInvalidError) as caught:
        t.requests(datetime(2030, 1, 1, 3, tzinfo=UTC))
    assert caught.value.meta["task"] == "half-bad"
    assert caught.value.meta["index"] == 1


async def test_enqueue_fires_the_entries_now_through_the_normal_path(
    tasks: TaskRegistry,
    digest: JobHandle[Any, Any],
    cleanup: JobHandle[Any, Any],
    driver: MemoryDriver,
    clock: ManualClock,
) -> None:
    t = task(
        cron="0 3 * * *",
        tz="Europe/Paris",
        enqueue=lambda at: [(digest, {"at": at}), (cleanup, {"at": at})],
        name="nightly",
        registry=tasks,
    )
    results = await t.enqueue()

    assert [r.deduped for r in results] == [False, False]
    page = await driver.introspect.list(JobFilter())
    by_id = {row.id: row for row in page.rows}
    assert [by_id[r.id].name for r in results] == ["send-digest", "cleanup"]
    # The occurrence it hands over is the driver's now, not a cron occurrence.
    assert by_id[results[0].id].input == {"at": clock.now().isoformat().replace("+00:00", "Z")}
    # The watermark is untouched: the schedule goes on as planned.
    assert await driver.scheduler_state.watermarks() == {}
    # Live keys dedupe a second manual fire at the same instant, as any enqueue does.
    assert [r.deduped for r in await t.enqueue()] == [True, True]


async def test_enqueue_validates_every_entry_before_writing_any(
    tasks: TaskRegistry, digest: JobHandle[Any, Any], driver: MemoryDriver
) -> None:
    t = task(
        cron="0 3 * * *",
        tz="UTC",
        enqueue=lambda at: [(digest, {"at": at}), (digest, {"at": "nope"})],
        name="half-bad",
        registry=tasks,
    )
    with pytest.raises(JobInputInvalidError):
        await t.enqueue(datetime(2030, 1, 1, tzinfo=UTC))
    assert driver.live_count() == 0


async def test_enqueue_without_a_driver_is_refused(
    tasks: TaskRegistry, digest: JobHandle[Any, Any]
) -> None:
    t = task(cron="0 3 * * *", tz="UTC", enqueue=lambda at: [(digest, {"at": at})], registry=tasks)
    with pytest.raises(DriverUnavailableError):
        await t.enqueue()


def test_next_task_run_is_strictly_after_and_aware_utc(tasks: TaskRegistry) -> None:
    t = task(cron="0 3 * * *", tz="Europe/Paris", enqueue=lambda at: [], registry=tasks)
    at = datetime(2030, 1, 1, 2, tzinfo=UTC)  # 03:00 Paris exactly
    assert next_task_run(t, at) == datetime(2030, 1, 2, 2, tzinfo=UTC)
    assert next_task_run(t, at - timedelta(seconds=1)) == at
    assert next_task_run(t, at).tzinfo is UTC
    with pytest.raises(ValueError, match="aware"):
        next_task_run(t, datetime(2030, 1, 1))
