"""backfill() on the memory driver: pages as steps, the throttle, the ledger, every refusal."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest
from pydantic import BaseModel

from jobs_core import (
    JobRegistry,
    JobState,
    Retry,
    backfill,
    pending_backfills,
    registered_backfills,
)
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import (
    BackfillEnvironmentError,
    BackfillMigrationPendingError,
    BackfillSourceInvalidError,
    JobDeclarationInvalidError,
    JobDuplicateError,
    NotImplementedByDriverError,
)
from jobs_core.testing import run_jobs, use_driver
from jobs_core.types import BackfillQuery


class Table:
    """An app's table of ``n`` rows read in pages of ``size`` (a remote cursor's shape)."""

    def __init__(self, n: int, size: int = 10) -> None:
        self.rows = list(range(n))
        self.size = size
        self.reads: Counter[Any] = Counter()

    def pages(self, cursor: Any, cancel: Any, input: Any) -> tuple[list[int], int | None]:
        self.reads[cursor] += 1
        start = cursor or 0
        end = start + self.size
        return self.rows[start:end], (end if end < len(self.rows) else None)


class Sink:
    """The handler: records every page it was handed; can fail once on a chosen page."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.pages: list[list[int]] = []
        self.fail_on = fail_on
        self.times: list[float] = []

    def __call__(self, rows: list[int], cancel: Any) -> None:
        self.times.append(time.monotonic())
        if self.fail_on is not None and rows and rows[0] == self.fail_on:
            self.fail_on = None
            raise ConnectionError("the app's database dropped the connection")
        self.pages.append(list(rows))


async def _pass(driver: MemoryDriver, registry: JobRegistry, bf: Any, **options: Any) -> Any:
    result = await bf.enqueue(**options)
    await run_jobs(driver, registry=registry, timeout="20s")
    return await driver.introspect.get(result.id)


@pytest.fixture
def real() -> MemoryDriver:
    """A memory driver on the real clock (the throttle and the retries wait real time)."""
    return MemoryDriver()


async def test_one_step_per_page_checkpoints_cursor_and_rows_never_the_page(
    real: MemoryDriver, registry: JobRegistry
) -> None:
    table, sink = Table(95), Sink()
    bf = backfill(
        name="bf.pages", tenant="none", pages=table.pages, handle=sink, rate=500, registry=registry
    )
    with use_driver(real):
        info = await _pass(real, registry, bf)
    assert info.state == JobState.DONE
    assert info.result == {"status": "completed", "pass": str(info.id), "rows": 95, "pages": 10}
    batches = [s for s in info.steps if s.name.startswith("batch:")]
    assert [s.name for s in batches] == [f"batch:{n}" for n in range(10)]
    assert batches[0].output == {"cursor": 10, "rows": 10}
    assert batches[-1].output == {"cursor": None, "rows": 5}
    assert info.steps[0].name == "begin" and info.steps[-1].name == "finish"
    assert sum(len(p) for p in sink.pages) == 95
    [ledger] = await real.backfills.passes(BackfillQuery(name="bf.pages"))
    assert (ledger.id, ledger.status, ledger.rows, ledger.last_cursor) == (
        info.id,
        "completed",
        95,
        None,
    )
    assert info.progress["done"] >= 10 and "cursor" in info.progress["note"]


async def test_a_failed_page_resumes_on_that_page_and_replays_the_rest_from_storage(
    real: MemoryDriver, registry: JobRegistry
) -> None:
    table, sink = Table(60), Sink(fail_on=40)
    bf = backfill(
        name="bf.resume",
        tenant="none",
        pages=table.pages,
        handle=sink,
        rate=500,
        retry=Retry(attempts=3, delay="10ms", jitter=False),
        registry=registry,
    )
    with use_driver(real):
        info = await _pass(real, registry, bf)
    assert info.state == JobState.DONE and info.attempt == 2
    # Pages 0-3 were read once: the retry replayed their checkpoints; page 4 twice (it failed).
    assert table.reads == Counter({None: 1, 10: 1, 20: 1, 30: 1, 40: 2, 50: 1})
    assert [p[0] for p in sink.pages] == [0, 10, 20, 30, 40, 50]
    assert info.result["rows"] == 60


async def test_rate_throttles_inside_each_step_and_a_replay_repays_none_of_it(
    real: MemoryDriver, registry: JobRegistry
) -> None:
    """The pause is spent inside the page's step (the step records show it), so a replay of
    the completed pages, which runs none of their functions, waits for none of them."""
    rate = 10.0
    table, sink = Table(110), Sink(fail_on=100)
    bf = backfill(
        name="bf.rate",
        tenant="none",
        pages=table.pages,
        handle=sink,
        rate=rate,
        retry=Retry(attempts=3, delay="50ms", jitter=False, backoff="fixed"),
        registry=registry,
    )
    with use_driver(real):
        info = await _pass(real, registry, bf)
    assert info.state == JobState.DONE and info.attempt == 2
    batches = [s for s in info.steps if s.name.startswith("batch:")]
    assert len(batches) == 11
    for record in batches:
        assert record.started_at is not None and record.completed_at is not None
        spent = (record.completed_at - record.started_at).total_seconds()
        assert spent >= 1 / rate - 0.005, (record.name, spent)
    # Page 10 failed at its first call and ran again after the 50 ms retry delay: between the
    # two calls the second attempt replayed pages 0-9 (a full re-pay would be >= 1 s).
    first, again = sink.times[-2], sink.times[-1]
    assert again - first < 0.05 + 10 / rate / 2, again - first
    assert table.reads[100] == 2 and all(table.reads[c] == 1 for c in [None, *range(10, 100, 10)])


async def test_a_completed_pass_makes_the_next_enqueue_skip_and_force_runs_a_new_pass(
    real: MemoryDriver, registry: JobRegistry
) -> None:
    table, sink = Table(20), Sink()
    bf = backfill(
        name="bf.skip", tenant="none", pages=table.pages, handle=sink, rate=500, registry=registry
    )
    with use_driver(real):
        first = await _pass(real, registry, bf)
        assert await pending_backfills(registry=registry) == []
        again = await _pass(real, registry, bf)
        forced = await _pass(real, registry, bf, force=True)
    assert again.result == {"status": "skipped", "pass": str(first.id), "rows": 20}
    assert [s.name for s in again.steps] == ["begin"]
    assert forced.result["status"] == "completed" and forced.result["pass"] == str(forced.id)
    assert len(sink.pages) == 4, "two passes of two pages; the skipped one handled nothing"
    passes = await real.backfills.passes(BackfillQuery(name="bf.skip"))
    assert [p.id for p in passes] == [forced.id, first.id]
    assert all(p.status == "completed" for p in passes)


class Org(BaseModel):
    org: str


async def test_input_and_scope_make_one_pass_per_scope(
    real: MemoryDriver, registry: JobRegistry
) -> None:
    seen: dict[str, list[Any]] = {}

    def pages(cursor: Any, cancel: Any, org: Org) -> tuple[list[str], None]:
        return [f"{org.org}-row"], None

    bf = backfill(
        name="bf.scoped",
        tenant=lambda org: org.org,
        input=Org,
        scope=lambda org: org.org,
        pages=pages,
        handle=lambda rows, cancel: seen.setdefault(rows[0], rows),
        rate=500,
        registry=registry,
    )
    with use_driver(real):
        a = await bf.enqueue(Org(org="acme"))
        a_again = await bf.enqueue({"org": "acme"})
        b = await bf.enqueue(Org(org="globex"))
        assert a_again.deduped and a_again.id == a.id and not b.deduped
        await run_jobs(real, registry=registry, timeout="20s")
        assert (await real.introspect.get(a.id)).idempotency_key == "bf.scoped:acme"
        assert (await real.introspect.get(a.id)).tenant_id == "acme"
        acme = await real.backfills.completed("bf.scoped", "acme")
        assert acme is not None and acme.id == a.id and acme.rows == 1
        assert await real.backfills.completed("bf.scoped", "") is None
        # A scoped backfill has no fixed scopes: the deploy gate does not wait for it.
        assert await pending_backfills(registry=registry) == []
    assert sorted(seen) == ["acme-row", "globex-row"]
    assert registered_backfills(registry) == [bf]


async def test_count_above_zero_after_the_last_page_is_stalled_and_fails_the_pass(
    real: MemoryDriver, registry: JobRegistry
) -> None:
    table = Table(30)
    remaining = {"n": 30}

    def handle(rows: list[int], cancel: Any) -> None:
        remaining["n"] -= len(rows) - 1  # one row of each page is never fixed

    bf = backfill(
        name="bf.stalls",
        tenant="none",
        pages=table.pages,
        handle=handle,
        count=lambda ctx: remaining["n"],
        rate=500,
        registry=registry,
    )
    with use_driver(real):
        info = await _pass(real, registry, bf)
    assert info.state == JobState.DEAD and info.last_error_code == "X_BACKFILL_STALLED"
    assert "3 row(s) to do" in (info.last_error or "")
    [ledger] = await real.backfills.passes(BackfillQuery(name="bf.stalls"))
    assert ledger.status == "failed" and ledger.rows == 30


async def test_environments_are_checked_at_the_enqueue_and_at_the_run(
    real: MemoryDriver, registry: JobRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    bf = backfill(
        name="bf.env",
        tenant="none",
        pages=Table(5).pages,
        handle=Sink(),
        environments=["staging", "production"],
        registry=registry,
    )
    with use_driver(real):
        monkeypatch.setenv("JOBS_ENV", "development")
        with pytest.raises(BackfillEnvironmentError) as refused:
            await bf.enqueue()
        assert refused.value.code == "X_BACKFILL_ENVIRONMENT"
        assert "staging, production" in str(refused.value) and "'development'" in str(refused.value)
        monkeypatch.delenv("JOBS_ENV")
        with pytest.raises(BackfillEnvironmentError, match="not set"):
            await bf.enqueue()
        # A row queued anyway (a task entry) is refused at its run, terminally.
        queued = await super(type(bf), bf).enqueue(bf.run_input())
        await run_jobs(real, registry=registry, timeout="10s")
        info = await real.introspect.get(queued.id)
        assert info.state == JobState.DEAD and info.last_error_code == "X_BACKFILL_ENVIRONMENT"
        monkeypatch.setenv("JOBS_ENV", "staging")
        assert not (await bf.enqueue()).deduped


async def test_requires_waits_for_the_migration(real: MemoryDriver, registry: JobRegistry) -> None:
    applied = {"2026_08_01_init"}
    bf = backfill(
        name="bf.requires",
        tenant="none",
        pages=Table(5).pages,
        handle=Sink(),
        requires="2026_08_14_add_publish_at",
        migrations=lambda: applied,
        rate=500,
        registry=registry,
    )
    with use_driver(real):
        with pytest.raises(BackfillMigrationPendingError) as refused:
            await bf.enqueue()
        assert refused.value.code == "X_BACKFILL_MIGRATION_PENDING"
        assert refused.value.meta["pending"] == ["2026_08_14_add_publish_at"]
        assert (await bf.plan()).would == "refuse"
        applied.add("2026_08_14_add_publish_at")
        assert (await bf.plan()).would == "run"
        info = await _pass(real, registry, bf)
    assert info.state == JobState.DONE


async def test_a_dry_run_plans_without_writing(real: MemoryDriver, registry: JobRegistry) -> None:
    table = Table(2_500)
    bf = backfill(
        name="bf.plan",
        tenant="none",
        pages=table.pages,
        handle=Sink(),
        batch=1_000,
        count=lambda ctx: 2_500,
        rate=5,
        registry=registry,
    )
    with use_driver(real):
        plan = await bf.plan()
        assert (plan.count, plan.pages, plan.seconds, plan.would) == (2_500, 3, 0.6, "run")
        assert plan.latest is None and plan.completed is None and len(plan.checksum) == 64
        assert await real.backfills.passes(BackfillQuery(name="bf.plan")) == []
        assert table.reads == Counter(), "a dry run reads no page"
        assert [b.name for b in await pending_backfills(registry=registry)] == ["bf.plan"]


def test_declaration_refusals_name_every_field(registry: JobRegistry) -> None:
    handle = Sink()
    with pytest.raises(BackfillSourceInvalidError) as neither:
        backfill(name="bf.none", tenant="none", handle=handle, registry=registry)
    assert neither.value.code == "X_BACKFILL_SOURCE_INVALID"
    assert "source/pages" in str(neither.value)
    with pytest.raises(BackfillSourceInvalidError):
        backfill(
            name="bf.both",
            tenant="none",
            handle=handle,
            pages=Table(1).pages,
            source=lambda ctx: None,  # type: ignore[arg-type,return-value]
            registry=registry,
        )
    with pytest.raises(JobDeclarationInvalidError) as bad:
        backfill(
            name="bf.bad",
            tenant="none",
            handle=handle,
            pages=Table(1).pages,
            batch=0,
            rate=0,
            input=Org,
            registry=registry,
        )
    assert bad.value.code == "X_JOB_DECLARATION_INVALID"
    fields = [p.split(":")[0] for p in bad.value.meta["problems"]]
    assert fields == ["batch", "rate", "input/scope"]
    assert "no way off" in str(bad.value)
    for rate in (float("nan"), float("inf"), -1, True, 10_000):
        with pytest.raises(JobDeclarationInvalidError, match="rate"):
            backfill(
                name="bf.rate",
                tenant="none",
                handle=handle,
                pages=Table(1).pages,
                rate=rate,
                registry=registry,
            )
    with pytest.raises(JobDeclarationInvalidError, match="migrations"):
        backfill(
            name="bf.req",
            tenant="none",
            handle=handle,
            pages=Table(1).pages,
            requires="m1",
            registry=registry,
        )
    assert registry.all() == []


def test_two_backfills_of_one_name_are_a_duplicate(registry: JobRegistry) -> None:
    def declare() -> Any:
        return backfill(
            name="bf.twice", tenant="none", handle=Sink(), pages=Table(1).pages, registry=registry
        )

    first = declare()
    assert declare() is not first  # the same call site again: a reload
    with pytest.raises(JobDuplicateError):
        backfill(
            name="bf.twice", tenant="none", handle=Sink(), pages=Table(1).pages, registry=registry
        )


class NoLedger(MemoryDriver):
    """A driver that keeps no backfill ledger (as Redis)."""

    capabilities = MemoryDriver.capabilities - {"backfills"}


async def test_a_driver_without_a_ledger_refuses_a_backfill_naming_the_fix(
    registry: JobRegistry,
) -> None:
    driver = NoLedger()
    bf = backfill(
        name="bf.noledger", tenant="none", pages=Table(3).pages, handle=Sink(), registry=registry
    )
    with use_driver(driver):
        with pytest.raises(NotImplementedByDriverError) as refused:
            await bf.enqueue()
        assert refused.value.code == "X_NOT_IMPLEMENTED"
        assert "postgresql://" in str(refused.value)
        queued = await super(type(bf), bf).enqueue(bf.run_input())
        await run_jobs(driver, registry=registry, timeout="10s")
        info = await driver.introspect.get(queued.id)
    assert info.state == JobState.DEAD and info.last_error_code == "X_NOT_IMPLEMENTED"


async def test_the_throttle_ends_on_cancel_and_the_page_still_checkpoints(
    real: MemoryDriver, registry: JobRegistry
) -> None:
    """A drain during a page's pause ends the pause at once; the page's step lands, so the next
    worker starts on the following page."""
    table, sink = Table(30), Sink()
    bf = backfill(
        name="bf.drain", tenant="none", pages=table.pages, handle=sink, rate=0.2, registry=registry
    )
    from jobs_core import Worker

    with use_driver(real):
        result = await bf.enqueue()
        worker = Worker(real, registry=registry, poll_interval="5ms", drain_timeout="5s")
        running = asyncio.create_task(worker.run())
        while not sink.pages:
            await asyncio.sleep(0.01)
        started = time.monotonic()
        await worker.drain()
        await running
        drained_in = time.monotonic() - started
        info = await real.introspect.get(result.id)
    assert drained_in < 2.0, "the 5 s pause was cut short"
    assert info.state == JobState.READY and info.attempt == 0, "interrupted, not counted"
    assert [s.name for s in info.steps if s.status == "completed"] == ["begin", "batch:0"]
    assert table.reads == Counter({None: 1})
