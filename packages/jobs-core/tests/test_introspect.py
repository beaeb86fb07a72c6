"""The public operator functions (jobs_core.introspect) over the memory driver: paging,
redaction, every change an operator makes, the capability errors, and the JSON form."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel, Field, SecretStr, field_serializer
from typing_extensions import TypedDict

from jobs_core import JobRegistry, Retry, introspect, job
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import (
    DriverRequestInvalidError,
    JobNotCancellableError,
    JobNotFoundError,
    JobNotPromotableError,
    JobNotRemovableError,
    JobNotRequeueableError,
    JobPageInvalidError,
    NotImplementedByDriverError,
    StepNotResolvableError,
)
from jobs_core.ids import new_id
from jobs_core.testing import ManualClock, run_jobs
from jobs_core.types import (
    BulkResult,
    ClaimRequest,
    EnqueueRequest,
    JobState,
    NackOptions,
    StepRecord,
    StepWrite,
)


class Item(BaseModel):
    key: str
    delay_ms: int = 0


def item_job(registry: JobRegistry, name: str, **options: Any) -> Any:
    return job(
        input=Item,
        idempotency_key=lambda i: f"{name}:{i.key}",
        tenant="none",
        name=name,
        registry=registry,
        **options,
    )


# --- paging ----------------------------------------------------------------------------------


async def test_450_rows_page_both_ways_without_repeats_or_gaps(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    @item_job(registry, "page")
    async def page(input: Item, step: Any, ctx: Any) -> None: ...

    ids: list[UUID] = []
    for i in range(450):
        ids.append((await page.enqueue(Item(key=str(i)))).id)
        if i % 7 == 0:
            clock.advance("1ms")  # several rows share an instant, others do not
    newest_first = ids[::-1]

    forward: list[list[UUID]] = []
    cursor: str | None = None
    pages = []
    while True:
        got = await introspect.list_jobs(driver, limit=200, after=cursor, registry=registry)
        pages.append(got)
        forward.append([row.id for row in got.rows])
        if got.next is None:
            break
        cursor = got.next
    assert [len(p) for p in forward] == [200, 200, 50]
    assert [i for p in forward for i in p] == newest_first
    assert pages[0].prev is None and pages[-1].next is None

    backward: list[list[UUID]] = [forward[-1]]
    cursor = pages[-1].prev
    while cursor is not None:
        got = await introspect.list_jobs(driver, limit=200, before=cursor, registry=registry)
        backward.insert(0, [row.id for row in got.rows])
        cursor = got.prev
    # Walking back from the oldest page meets the same pages: the same 450 rows, none twice.
    assert backward == forward
    assert len(set(newest_first)) == 450

    filtered = await introspect.list_jobs(driver, limit=5, name="page", state="ready")
    assert [row.id for row in filtered.rows] == newest_first[:5]
    prefix = str(ids[0])[:36]
    assert [r.id for r in (await introspect.list_jobs(driver, id_prefix=prefix)).rows] == [ids[0]]


async def test_bad_pages_and_filters_are_refused(driver: MemoryDriver) -> None:
    with pytest.raises(JobPageInvalidError):
        await introspect.list_jobs(driver, limit=201)
    with pytest.raises(JobPageInvalidError):
        await introspect.list_jobs(driver, after="not-a-cursor")
    with pytest.raises(DriverRequestInvalidError):
        await introspect.list_jobs(driver, state="exploded")


# --- redaction -------------------------------------------------------------------------------


class Card(BaseModel):
    number: str = Field(json_schema_extra={"sensitive": True})
    holder: str


class Wallet(BaseModel):
    label: str
    pin: SecretStr


class Payment(BaseModel):
    order: str
    api_secret: SecretStr
    backup: SecretStr | None = None
    card: Card
    wallets: list[Wallet] = []
    by_region: dict[str, Card] = {}
    note: str = Field(default="", alias="Note", json_schema_extra={"sensitive": True})
    meta: dict[str, Any] = {}

    # Secrets must reach the body, so this model stores them in clear text: exactly the case
    # redaction exists for.
    @field_serializer("api_secret", when_used="json")
    def _reveal(self, value: SecretStr) -> str:
        return value.get_secret_value()


class Rows(TypedDict):
    table: str
    token: str


@dataclass
class Upload:
    path: str
    signature: str = Field(json_schema_extra={"sensitive": True})


def payment_input() -> dict[str, Any]:
    return {
        "order": "o-1",
        "api_secret": "sk_live_123",
        "card": {"number": "4242424242424242", "holder": "Ada"},
        "wallets": [{"label": "main", "pin": "9999"}],
        "by_region": {"eu": {"number": "5555", "holder": "Bo"}},
        "Note": "door code 1234",
        "meta": {"Authorization": "Bearer abc", "nested": [{"password": "hunter2", "ok": 1}]},
    }


async def test_get_job_masks_sensitive_fields_and_keys_at_any_depth(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    @job(input=Payment, idempotency_key=lambda p: p.order, tenant="none", registry=registry)
    async def charge(p: Payment, step: Any, ctx: Any) -> None: ...

    queued = await charge.enqueue(payment_input())
    stored = await driver.introspect.get(queued.id)
    assert stored is not None and stored.input["api_secret"] == "sk_live_123"

    view = await introspect.get_job(driver, str(queued.id), registry=registry)

    assert view.declared
    shown = view.job.input
    assert shown["order"] == "o-1"
    assert shown["api_secret"] == "[redacted]"
    assert shown["backup"] is None  # whether a secret was given is not itself a secret
    assert shown["card"] == {"number": "[redacted]", "holder": "Ada"}
    assert shown["wallets"] == [{"label": "main", "pin": "[redacted]"}]
    assert shown["by_region"] == {"eu": {"number": "[redacted]", "holder": "Bo"}}
    assert shown["note"] == "[redacted]"  # stored under the field name, marked via its alias
    assert shown["meta"] == {
        "Authorization": "[redacted]",
        "nested": [{"password": "[redacted]", "ok": 1}],
    }
    text = json.dumps(introspect.as_json(view))
    for secret in ("sk_live_123", "4242424242424242", "9999", "5555", "door code", "hunter2"):
        assert secret not in text

    # A caller's own key set replaces the default one.
    narrow = await introspect.get_job(driver, queued.id, registry=registry, redact_keys={"ok"})
    assert narrow.job.input["meta"]["nested"] == [{"password": "hunter2", "ok": "[redacted]"}]
    assert narrow.job.input["card"]["number"] == "[redacted]"  # the model's marks still hold


async def test_dataclass_and_typeddict_inputs_are_masked_too(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    @job(input=Upload, idempotency_key=lambda u: u.path, tenant="none", registry=registry)
    async def upload(u: Upload, step: Any, ctx: Any) -> None: ...

    @job(
        input=list[Rows], idempotency_key=lambda r: r[0]["table"], tenant="none", registry=registry
    )
    async def load(r: list[Rows], step: Any, ctx: Any) -> None: ...

    first = await upload.enqueue({"path": "/a", "signature": "sig-1"})
    second = await load.enqueue([{"table": "t", "token": "tk-1"}])

    assert (await introspect.get_job(driver, first.id, registry=registry)).job.input == {
        "path": "/a",
        "signature": "[redacted]",
    }
    assert (await introspect.get_job(driver, second.id, registry=registry)).job.input == [
        {"table": "t", "token": "[redacted]"}
    ]


async def test_an_undeclared_job_shows_its_input_redacted_whole(driver: MemoryDriver) -> None:
    req = EnqueueRequest(
        name="elsewhere.job",
        queue="default",
        input={"harmless": 1},
        idempotency_key="k",
        tenant_id=None,
        max_attempts=1,
        id=new_id(),
        run_id=new_id(),
    )
    await driver.enqueue(req)

    view = await introspect.get_job(driver, req.id, registry=JobRegistry())
    page = await introspect.list_jobs(driver, registry=JobRegistry())

    assert not view.declared
    assert view.job.input == "[redacted]"
    assert page.rows[0].input == "[redacted]"


async def test_results_progress_and_step_outputs_are_masked_by_key(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    @item_job(registry, "issue")
    async def issue(input: Item, step: Any, ctx: Any) -> dict[str, str]:
        await step.run("mint", lambda: {"access_token": "at-1", "kind": "bearer"})
        return {"refresh_token": "rt-1", "status": "ok"}

    queued = await issue.enqueue(Item(key="a"))
    await run_jobs(driver, registry=registry)

    shown = (await introspect.get_job(driver, queued.id, registry=registry)).job

    assert shown.state is JobState.DONE
    assert shown.result == {"refresh_token": "[redacted]", "status": "ok"}
    assert [s.output for s in shown.steps] == [{"access_token": "[redacted]", "kind": "bearer"}]


# --- operator changes ------------------------------------------------------------------------


async def test_requeue_cancel_remove_promote_through_the_public_functions(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry, caplog: Any
) -> None:
    calls: list[str] = []

    @item_job(registry, "flaky", retry=Retry(attempts=1))
    async def flaky(input: Item, step: Any, ctx: Any) -> None:
        await step.run("one", lambda: calls.append("one"))
        await step.run("two", lambda: calls.append("two"))
        if len(calls) < 3:
            raise RuntimeError("not yet")

    failed = await flaky.enqueue(Item(key="a"))
    await run_jobs(driver, registry=registry)
    assert (await introspect.get_job(driver, failed.id, registry=registry)).job.state is (
        JobState.DEAD
    )

    with caplog.at_level(logging.INFO, logger="jobs.operator"):
        again = await introspect.requeue(driver, str(failed.id), from_step="two")
    assert again.state is JobState.READY and [s.name for s in again.steps] == ["one"]
    assert [r.getMessage() for r in caplog.records] == ["jobs.operator.requeued"]
    await run_jobs(driver, registry=registry)
    assert calls == ["one", "two", "two"]  # "one" replayed from storage
    assert (await introspect.get_job(driver, failed.id)).job.state is JobState.DONE
    # A done job requeued without from_step replays every step from storage.
    await introspect.requeue(driver, failed.id)
    await run_jobs(driver, registry=registry)
    assert calls == ["one", "two", "two"]
    assert (await introspect.get_job(driver, failed.id)).job.state is JobState.DONE

    waiting = await flaky.enqueue(Item(key="later"), delay="1h")
    promoted = await introspect.promote(driver, waiting.id)
    assert promoted.state is JobState.READY and promoted.run_at == clock.now()
    cancelled = await introspect.cancel(driver, waiting.id, "not today")
    assert (cancelled.state, cancelled.last_error) == (JobState.CANCELLED, "not today")
    await introspect.remove(driver, waiting.id)
    with pytest.raises(JobNotFoundError):
        await introspect.get_job(driver, waiting.id)

    for refused, call in (
        (
            JobNotRequeueableError,
            introspect.requeue(driver, (await flaky.enqueue(Item(key="b"))).id),
        ),
        (JobNotCancellableError, introspect.cancel(driver, failed.id)),
        (JobNotPromotableError, introspect.promote(driver, failed.id)),
        (JobNotFoundError, introspect.remove(driver, "not-a-uuid")),
        (JobNotFoundError, introspect.requeue(driver, new_id())),
    ):
        with pytest.raises(refused):
            await call


async def test_a_running_job_is_not_removable_and_bulk_calls_report_counts(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    @item_job(registry, "bulk")
    async def bulk(input: Item, step: Any, ctx: Any) -> None: ...

    await bulk.enqueue_many([Item(key=str(i)) for i in range(5)], delay="1h")
    running = await bulk.enqueue(Item(key="run"))
    await driver.claim(ClaimRequest(["default"], 1, 60_000, "w1"))
    with pytest.raises(JobNotRemovableError):
        await introspect.remove(driver, running.id)

    assert await introspect.promote_many(driver, name="bulk") == BulkResult(5, 0)
    claimed = await driver.claim(ClaimRequest(["default"], 10, 60_000, "w1"))
    for row in claimed:
        await driver.nack(row.id, NackOptions(row.fence, dead_letter=True))
    assert await introspect.requeue_many(driver, state=JobState.DEAD) == BulkResult(5, 0)
    assert await introspect.remove_many(driver, state="ready") == BulkResult(5, 0)
    page = await introspect.list_jobs(driver)
    assert [row.id for row in page.rows] == [running.id]


async def test_resolve_step_settles_an_unknown_once_step(driver: MemoryDriver) -> None:
    req = EnqueueRequest("once", "default", {}, "k", None, 3, new_id(), new_id())
    await driver.enqueue(req)
    [row] = await driver.claim(ClaimRequest(["default"], 1, 60_000, "w1"))
    started = StepRecord(name="charge", status="started", once=True)
    await driver.steps.write(StepWrite(row.id, row.fence, row.run_id, started))

    await introspect.resolve_step(driver, str(row.id), "charge", ran=True, output={"id": "ch_1"})

    [step] = await driver.steps.load(row.run_id)
    assert (step.status, step.output) == ("completed", {"id": "ch_1"})
    with pytest.raises(StepNotResolvableError):
        await introspect.resolve_step(driver, row.id, "charge", ran=False)


# --- queues, tasks, stats, workers, counters -------------------------------------------------


async def test_pausing_queues_and_the_stats_overview(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    @item_job(registry, "mail", queue="mail")
    async def mail(input: Item, step: Any, ctx: Any) -> None: ...

    await mail.enqueue(Item(key="a"))
    await mail.enqueue(Item(key="b"))
    await introspect.pause_queue(driver, "mail")
    await introspect.pause_queue(driver, "empty")

    assert await introspect.paused_queues(driver) == ["empty", "mail"]
    assert await driver.claim(ClaimRequest(["mail"], 5, 1000, "w1")) == []
    overview = {q.stats.queue: q for q in await introspect.stats(driver)}
    assert (overview["mail"].stats.ready, overview["mail"].demand, overview["mail"].paused) == (
        2,
        0,
        True,
    )
    assert overview["empty"].paused is True and overview["empty"].stats.ready == 0

    await introspect.resume_queue(driver, "mail")
    overview = {q.stats.queue: q for q in await introspect.stats(driver)}
    assert (overview["mail"].demand, overview["mail"].paused) == (2, False)
    assert len(await driver.claim(ClaimRequest(["mail"], 5, 1000, "w1"))) == 2


async def test_pausing_tasks_through_the_scheduler_state(driver: MemoryDriver) -> None:
    await introspect.pause_task(driver, "nightly")
    await introspect.pause_task(driver, "hourly")
    assert await introspect.paused_tasks(driver) == ["hourly", "nightly"]
    await introspect.resume_task(driver, "hourly")
    assert await introspect.paused_tasks(driver) == ["nightly"]
    [task] = await introspect.tasks(driver)
    assert (task.task, task.paused, task.watermark, task.last_fire) == (
        "nightly",
        True,
        None,
        None,
    )


async def test_counters_through_the_public_functions(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    @item_job(registry, "counted", retry=Retry(attempts=2, delay="1s", jitter=False))
    async def counted(input: Item, step: Any, ctx: Any) -> None:
        if input.key == "bad":
            raise RuntimeError("no")

    since = clock.now()
    await counted.enqueue_many([Item(key="a"), Item(key="b"), Item(key="bad")])
    await run_jobs(driver, registry=registry, clock=clock)

    totals = await introspect.counter_totals(driver, since=since)
    assert (totals["counted"].done, totals["counted"].retried, totals["counted"].dead) == (2, 1, 1)
    buckets = await introspect.counters(driver, "counted", since=since)
    assert sum(b.done for b in buckets) == 2 and buckets[0].tier == "1m"
    clock.set(since + timedelta(days=31))
    # Every minute bucket folds into a 5-minute one, that into an hour, and the hour expires.
    assert await introspect.rollup_counters(driver) >= len(buckets) + 2
    assert await introspect.counter_totals(driver, since=since) == {}
    with pytest.raises(DriverRequestInvalidError):
        await introspect.counters(driver, "counted", since=datetime(2030, 1, 1))


class Bare(MemoryDriver):
    """A real memory driver that declares no optional capability."""

    capabilities = frozenset()


async def test_missing_capabilities_answer_not_implemented() -> None:
    bare = Bare()
    since = datetime(2030, 1, 1, tzinfo=UTC)
    for call in (
        introspect.list_jobs(bare),
        introspect.get_job(bare, new_id()),
        introspect.requeue_many(bare),
        introspect.pause_queue(bare, "q"),
        introspect.pause_task(bare, "t"),
        introspect.tasks(bare),
        introspect.workers(bare),
        introspect.counter_totals(bare, since=since),
        introspect.rollup_counters(bare),
    ):
        with pytest.raises(NotImplementedByDriverError) as refused:
            await call
        assert refused.value.code == "X_NOT_IMPLEMENTED"
    # Counts and demand are part of every driver; the pause state is then unknown.
    await bare.enqueue(EnqueueRequest("j", "q", {}, "k", None, 1, new_id(), new_id()))
    [overview] = await introspect.stats(bare)
    assert (overview.stats.ready, overview.demand, overview.paused) == (1, 1, None)


def test_as_json_gives_plain_json() -> None:
    when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    uid = new_id()
    value = introspect.as_json(
        {"at": when, "id": uid, "state": JobState.DEAD, "tags": ("a", "b"), "set": {2, 1}}
    )
    assert value == {
        "at": "2030-01-02T03:04:05+00:00",
        "id": str(uid),
        "state": "dead",
        "tags": ["a", "b"],
        "set": [1, 2],
    }
    assert json.loads(json.dumps(value)) == value
