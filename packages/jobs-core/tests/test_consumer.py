"""consumer() on the memory driver: arm and supervisor, batches, the cursor in the batch's
transaction, at least once per item, the drain between batches, and every refusal."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from jobs_core import (
    ConsumerKey,
    JobRegistry,
    JobState,
    MemoryCursorStore,
    Retry,
    TaskRegistry,
    Worker,
    consumer,
)
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import ConsumerInvalidError
from jobs_core.faults import Boundary, install_fault_hook
from jobs_core.testing import run_jobs, use_driver


class Feed:
    """A vendor's feed: items ``0..n-1`` after a cursor (the next item's number)."""

    def __init__(self, n: int) -> None:
        self.items = list(range(n))
        self.opened: list[Any] = []

    async def since(self, cursor: Any, cancel: Any) -> AsyncIterator[int]:
        self.opened.append(cursor)
        for item in self.items[cursor or 0 :]:
            await asyncio.sleep(0)
            yield item


class Effects:
    """The app's table: ``handle`` upserts items (idempotently) and answers the next cursor."""

    def __init__(self) -> None:
        self.rows: set[int] = set()
        self.deliveries: Counter[int] = Counter()
        self.batches: list[list[int]] = []

    def handle(self, items: list[int], tx: Any) -> int:
        self.deliveries.update(items)
        self.batches.append(items)
        self.rows.update(items)
        return items[-1] + 1


@pytest.fixture
def real() -> MemoryDriver:
    return MemoryDriver()


def _declare(
    registry: JobRegistry, feed: Feed, effects: Effects, store: MemoryCursorStore, **options: Any
) -> Any:
    options.setdefault("keys", lambda: ["orders", "refunds"])
    return consumer(
        name=options.pop("name", "c.orders"),
        tenant="none",
        open=feed.since,
        handle=options.pop("handle", effects.handle),
        cursor=store,
        batch=options.pop("batch", 10),
        max_wait="20ms",
        registry=registry,
        task_registry=options.pop("task_registry", TaskRegistry()),
        **options,
    )


async def test_arm_starts_a_body_per_key_and_a_rearm_resumes_each_from_its_cursor(
    real: MemoryDriver, registry: JobRegistry
) -> None:
    feed, effects, store = Feed(25), Effects(), MemoryCursorStore()
    tasks = TaskRegistry()
    c = _declare(registry, feed, effects, store, task_registry=tasks)
    assert [t.name for t in tasks.all()] == ["c.orders.supervisor"]
    assert c.supervisor.cron == "* * * * *" and c.supervisor.tz == "UTC"
    [(armed_job, _)] = c.supervisor.entries(datetime.now(UTC))
    assert armed_job is c.arm and c.arm.name == "c.orders.arm"
    with use_driver(real):
        first = await c.arm.enqueue({})
        await run_jobs(real, registry=registry, timeout="20s")
        assert (await real.introspect.get(first.id)).result == {
            "keys": 2,
            "started": 2,
            "live": 0,
        }
        assert await store.load("c.orders", "orders") == 25
        assert effects.deliveries == Counter({i: 2 for i in range(25)}), "once per key"
        assert Counter(len(b) for b in effects.batches) == Counter({10: 4, 5: 2})
        feed.items += [25, 26, 27]
        await c.arm.enqueue({})
        await run_jobs(real, registry=registry, timeout="20s")
    assert feed.opened == [None, None, 25, 25], "the second bodies opened at their cursors"
    assert effects.deliveries[26] == 2 and effects.deliveries[3] == 2


async def test_a_live_key_is_deduped_by_the_rearm(
    real: MemoryDriver, registry: JobRegistry
) -> None:
    feed, effects, store = Feed(0), Effects(), MemoryCursorStore()
    c = _declare(registry, feed, effects, store, keys=lambda: ["orders"])
    with use_driver(real):
        live = await c.enqueue(ConsumerKey(key="orders"))
        armed = await c.arm.run_inline({})
    assert armed == {"keys": 1, "started": 0, "live": 1}
    row = await real.introspect.get(live.id)
    assert row.idempotency_key == "consumer:c.orders:orders"


async def test_a_failed_batch_is_delivered_again_and_the_cursor_stays_behind_it(
    real: MemoryDriver, registry: JobRegistry
) -> None:
    feed, effects, store = Feed(30), Effects(), MemoryCursorStore()
    failures = {"left": 1}

    def handle(items: list[int], tx: Any) -> int:
        effects.deliveries.update(items)
        if items[0] == 10 and failures["left"]:
            failures["left"] -= 1
            raise ConnectionError("the app's database blinked")
        effects.rows.update(items)
        return items[-1] + 1

    c = _declare(
        registry,
        feed,
        effects,
        store,
        handle=handle,
        keys=lambda: ["orders"],
        retry=Retry(attempts=3, delay="10ms"),
    )
    with use_driver(real):
        started = await c.enqueue({"key": "orders"})
        await run_jobs(real, registry=registry, timeout="20s")
        info = await real.introspect.get(started.id)
    assert info.state == JobState.DONE and info.attempt == 2
    assert feed.opened == [None, 10], "the retry reopened at the last committed cursor"
    assert effects.rows == set(range(30))
    assert {i for i, n in effects.deliveries.items() if n == 2} == set(range(10, 20))
    assert info.steps == (), "a consumer writes no steps: the cursor store is its checkpoint"


async def test_a_kill_between_the_effect_and_the_commit_leaves_the_cursor_behind(
    real: MemoryDriver, registry: JobRegistry
) -> None:
    """The batch boundaries are fault points: an attempt dying after ``handle`` returned and
    before the commit leaves the cursor where it was, and the batch comes again."""
    feed, effects, store = Feed(20), Effects(), MemoryCursorStore()
    armed = {"fire": True}

    def hook(at: Boundary) -> None:
        if at.job == "c.kill" and at.point == "returned" and at.step == "batch:1" and armed["fire"]:
            armed["fire"] = False
            raise ConnectionError("killed between the effect and the commit")

    c = _declare(
        registry,
        feed,
        effects,
        store,
        name="c.kill",
        keys=lambda: ["k"],
        retry=Retry(attempts=2, delay="10ms"),
    )
    install_fault_hook(hook)
    try:
        with use_driver(real):
            await c.enqueue({"key": "k"})
            await run_jobs(real, registry=registry, timeout="20s")
    finally:
        install_fault_hook(None)
    assert feed.opened == [None, 10]
    assert effects.deliveries == Counter(
        {**{i: 1 for i in range(10)}, **{i: 2 for i in range(10, 20)}}
    )
    assert await store.load("c.kill", "k") == 20


async def test_the_drain_is_honoured_between_batches(
    real: MemoryDriver, registry: JobRegistry
) -> None:
    """A drain during a batch lets it commit, then the body stops: interrupted, not counted."""
    feed, store = Feed(1_000), MemoryCursorStore()
    handled: list[list[int]] = []
    in_handle = asyncio.Event()
    release = asyncio.Event()

    async def handle(items: list[int], tx: Any) -> int:
        handled.append(items)
        if len(handled) == 3:
            in_handle.set()
            await release.wait()
        return items[-1] + 1

    c = _declare(registry, feed, Effects(), store, handle=handle, keys=lambda: ["k"])
    with use_driver(real):
        started = await c.enqueue({"key": "k"})
        worker = Worker(real, registry=registry, poll_interval="5ms", drain_timeout="10s")
        running = asyncio.create_task(worker.run())
        await in_handle.wait()
        draining = asyncio.create_task(worker.drain())
        await asyncio.sleep(0.05)
        release.set()
        await draining
        await running
        info = await real.introspect.get(started.id)
    assert len(handled) == 3, "no batch after the drain began"
    assert await store.load("c.orders", "k") == 30, "the batch in hand committed"
    assert info.state == JobState.READY and info.attempt == 0


async def test_a_self_enqueue_from_inside_the_run_is_refused(
    real: MemoryDriver, registry: JobRegistry
) -> None:
    feed, store = Feed(3), MemoryCursorStore()
    refused: list[str] = []
    box: dict[str, Any] = {}

    async def handle(items: list[int], tx: Any) -> int:
        try:
            await box["c"].enqueue({"key": "other"})
        except Exception as exc:
            refused.append(getattr(exc, "code", ""))
        return items[-1] + 1

    box["c"] = _declare(registry, feed, Effects(), store, handle=handle, keys=lambda: ["k"])
    with use_driver(real):
        await box["c"].enqueue({"key": "k"})
        await run_jobs(real, registry=registry, timeout="20s")
        # Outside a run the same enqueue is an ordinary one.
        assert not (await box["c"].enqueue({"key": "other"})).deduped
    assert refused == ["X_CONSUMER_SELF_ENQUEUE"]


def test_bad_declarations_are_refused_naming_every_field(registry: JobRegistry) -> None:
    feed = Feed(1)
    with pytest.raises(ConsumerInvalidError) as refused:
        consumer(
            name="c.bad",
            tenant="none",
            keys=lambda: ["k"],
            open=feed.since,
            handle=lambda items: None,
            timeout="10m",
            batch=0,
            rearm="7m",
            registry=registry,
        )
    assert refused.value.code == "X_CONSUMER_INVALID"
    fields = [p.split(":")[0] for p in refused.value.meta["problems"]]
    assert fields == ["cursor", "timeout", "batch", "rearm"]
    for rearm in ("90s", "5h", "2d", "0s"):
        with pytest.raises(ConsumerInvalidError, match="rearm"):
            consumer(
                name="c.rearm",
                tenant="none",
                keys=lambda: [],
                open=feed.since,
                handle=lambda items: None,
                cursor=MemoryCursorStore(),
                rearm=rearm,
                registry=registry,
            )
    assert registry.all() == []
    for rearm, cron in (("5m", "*/5 * * * *"), ("1h", "0 * * * *"), ("6h", "0 */6 * * *")):
        made = consumer(
            name=f"c.ok.{rearm}",
            tenant="none",
            keys=lambda: [],
            open=feed.since,
            handle=lambda items: None,
            cursor=MemoryCursorStore(),
            rearm=rearm,
            registry=registry,
            task_registry=TaskRegistry(),
        )
        assert made.supervisor.cron == cron
        assert made.describe()["factory"] == "consumer" and made.timeout_ms is None
