"""The transactional outbox: staging inside a transaction, the relay, and the memory store."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from jobs_core import (
    Actor,
    JobRegistry,
    MemoryOutboxStore,
    Outbox,
    Relay,
    acting_as,
    install_outbox,
    job,
    uninstall_outbox,
    use_driver,
    use_outbox,
)
from jobs_core import cli as jobs_cli
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import (
    DriverRequestInvalidError,
    DriverUnavailableError,
    JobOptionsInvalidError,
    OutboxNoTransactionError,
    TenantMismatchError,
)
from jobs_core.outbox import installed_outbox
from jobs_core.testing import ManualClock
from jobs_core.types import EnqueueRequest, EnqueueResult, OutboxClaim


class Signup(BaseModel):
    user_id: str
    org_id: str = "org-1"


def welcome_job(registry: JobRegistry) -> Any:
    @job(
        input=Signup,
        idempotency_key=lambda i: f"welcome:{i.user_id}",
        tenant=lambda i: i.org_id,
        name="welcome",
        registry=registry,
    )
    async def welcome(input: Signup, step: Any, ctx: Any) -> None:
        return None

    return welcome


@pytest.fixture
def store(clock: ManualClock) -> MemoryOutboxStore:
    return MemoryOutboxStore(clock)


@pytest.fixture
def outbox(store: MemoryOutboxStore, driver: MemoryDriver) -> Iterator[Outbox]:
    with use_outbox(store, driver) as installed:
        yield installed


@pytest.fixture
def welcome(registry: JobRegistry) -> Any:
    return welcome_job(registry)


class Boom(Exception):
    pass


class RelayKilled(Exception):
    """What a relay process killed between its publish and its mark looks like to its caller."""


class Recording:
    """A driver whose enqueues record every answer and can refuse one job id on demand.

    ``calls`` counts round trips: one per ``enqueue`` and one per ``enqueue_many``.
    """

    def __init__(self, inner: MemoryDriver, refuse: UUID | None = None) -> None:
        self.inner = inner
        self.refuse = refuse
        self.answers: list[EnqueueResult] = []
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def enqueue(self, req: EnqueueRequest) -> EnqueueResult:
        return (await self._publish("enqueue", [req]))[0]

    async def enqueue_many(self, reqs: Any) -> list[EnqueueResult]:
        return await self._publish("enqueue_many", list(reqs))

    async def _publish(self, call: str, reqs: list[EnqueueRequest]) -> list[EnqueueResult]:
        self.calls[call] += 1
        # Yield first, so concurrent relays interleave their publishes.
        await asyncio.sleep(0)
        if any(req.id == self.refuse for req in reqs):
            raise DriverUnavailableError("the queue is unreachable", driver="memory")
        answers = await self.inner.enqueue_many(reqs)
        self.answers += answers
        return answers


class KilledBeforeMark:
    """The shared store, seen by a relay that dies after publishing and before marking."""

    def __init__(self, inner: MemoryOutboxStore) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def mark_published(self, ids: Any, token: str) -> int:
        raise RelayKilled


async def drained(store: MemoryOutboxStore) -> None:
    async def poll() -> None:
        while store.pending_count():
            await asyncio.sleep(0.005)

    await asyncio.wait_for(poll(), 10)


# --- staging ------------------------------------------------------------------------------------


async def test_a_rolled_back_transaction_leaves_no_job(
    outbox: Outbox, store: MemoryOutboxStore, driver: MemoryDriver, welcome: Any
) -> None:
    staged: list[EnqueueResult] = []
    with pytest.raises(Boom):
        async with store.transaction():
            staged.append(await welcome.enqueue(Signup(user_id="u1")))
            raise Boom

    assert await Relay(store, driver).run_once() == 0
    assert store.pending_count() == 0
    assert await driver.introspect.get(staged[0].id) is None
    assert driver.live_count() == 0


async def test_a_commit_publishes_once_onto_the_ids_answered_at_stage_time(
    outbox: Outbox, store: MemoryOutboxStore, driver: MemoryDriver, welcome: Any
) -> None:
    relay = Relay(store, driver)
    async with store.transaction():
        staged = await welcome.enqueue(Signup(user_id="u1"))
        # Nothing is visible to a relay (or queued) before the commit.
        assert await relay.run_once() == 0
        assert driver.live_count() == 0

    assert staged.deduped is False
    assert store.pending_count() == 1
    assert await relay.run_once() == 1
    assert await relay.run_once() == 0
    row = await driver.introspect.get(staged.id)
    assert row is not None
    assert (row.id, row.run_id, row.tenant_id) == (staged.id, staged.run_id, "org-1")
    assert driver.live_count() == 1
    assert store.pending_count() == 0


async def test_an_explicit_transaction_stages_without_being_ambient(
    outbox: Outbox, store: MemoryOutboxStore, driver: MemoryDriver, welcome: Any
) -> None:
    tx = store.begin()
    assert store.ambient() is None
    staged = await welcome.enqueue(Signup(user_id="u1"), outbox=tx)
    assert driver.live_count() == 0
    assert store.pending_count() == 0

    assert await tx.commit() == 1
    assert await Relay(store, driver).run_once() == 1
    assert (await driver.introspect.get(staged.id)) is not None
    with pytest.raises(DriverRequestInvalidError):
        await welcome.enqueue(Signup(user_id="u2"), outbox=tx)


async def test_enqueue_as_and_run_id_stage_with_what_they_name(
    outbox: Outbox, store: MemoryOutboxStore, driver: MemoryDriver, welcome: Any
) -> None:
    run_id = UUID("01890000-0000-7000-8000-000000000001")
    async with store.transaction():
        staged = await welcome.enqueue_as(
            Actor(id="user-7", org_id="org-1"), Signup(user_id="u1"), run_id=run_id
        )
    await Relay(store, driver).run_once()

    row = await driver.introspect.get(staged.id)
    assert row is not None
    assert staged.run_id == run_id == row.run_id
    assert row.enqueued_by == "user-7"


async def test_enqueue_many_stages_one_batch_and_answers_repeats_in_it(
    outbox: Outbox, store: MemoryOutboxStore, driver: MemoryDriver, welcome: Any
) -> None:
    async with store.transaction():
        results = await welcome.enqueue_many(
            [Signup(user_id="u1"), Signup(user_id="u2"), Signup(user_id="u1")]
        )

    assert [r.deduped for r in results] == [False, False, True]
    assert (results[2].id, results[2].run_id) == (results[0].id, results[0].run_id)
    assert store.pending_count() == 2
    assert await Relay(store, driver).run_once() == 2
    for result in results:
        row = await driver.introspect.get(result.id)
        assert row is not None
        assert row.run_id == result.run_id


class StageOnly:
    """An outbox store that carries only the required members: no ``stage_many``."""

    def __init__(self, inner: MemoryOutboxStore) -> None:
        self.inner = inner
        self.staged = 0

    def ambient(self) -> Any:
        return self.inner.ambient()

    async def stage(self, req: EnqueueRequest, tx: Any) -> None:
        self.staged += 1
        await self.inner.stage(req, tx)

    async def claim(self, req: OutboxClaim) -> Any:
        return await self.inner.claim(req)

    async def release(self, ids: Any, token: str) -> None:
        await self.inner.release(ids, token)

    async def mark_published(self, ids: Any, token: str) -> int:
        return await self.inner.mark_published(ids, token)


async def test_stage_many_is_optional_the_facade_stages_one_by_one(
    store: MemoryOutboxStore, driver: MemoryDriver, welcome: Any
) -> None:
    minimal = StageOnly(store)
    assert not hasattr(minimal, "stage_many")
    with use_outbox(minimal, driver):  # type: ignore[arg-type]
        async with store.transaction():
            results = await welcome.enqueue_many(
                [Signup(user_id="u1"), Signup(user_id="u2"), Signup(user_id="u1")]
            )
    assert minimal.staged == 2
    assert [r.deduped for r in results] == [False, False, True]
    assert await Relay(minimal, driver, exclusive=False).run_once() == 2  # type: ignore[arg-type]
    assert driver.live_count() == 2


async def test_a_refused_enqueue_stages_nothing(
    outbox: Outbox, store: MemoryOutboxStore, driver: MemoryDriver, welcome: Any
) -> None:
    async with store.transaction():
        with pytest.raises(TenantMismatchError):
            await welcome.enqueue(Signup(user_id="u1"), tenant_id="org-2")
        with pytest.raises(TenantMismatchError):
            await welcome.enqueue_as(Actor(id="a", org_id="org-2"), Signup(user_id="u1"))
        with acting_as(Actor(id="a", org_id="org-2")), pytest.raises(TenantMismatchError):
            await welcome.enqueue(Signup(user_id="u1"))
        # One bad input in a batch stages none of it, the good ones before it included.
        with pytest.raises(TenantMismatchError) as refused:
            await welcome.enqueue_many(
                [Signup(user_id="u1"), Signup(user_id="u2", org_id="org-2")], tenant_id="org-1"
            )
        assert refused.value.meta["index"] == 1
        # A duplicate is known only at publish, so on_conflict="error" cannot be honoured.
        with pytest.raises(JobOptionsInvalidError) as conflict:
            await welcome.enqueue(Signup(user_id="u1"), on_conflict="error")
        assert conflict.value.meta["option"] == "on_conflict"

    assert store.pending_count() == 0
    assert await Relay(store, driver).run_once() == 0
    assert driver.live_count() == 0


async def test_outside_a_transaction_optional_queues_directly(
    outbox: Outbox, store: MemoryOutboxStore, driver: MemoryDriver, welcome: Any
) -> None:
    assert outbox.mode == "optional"
    direct = await welcome.enqueue(Signup(user_id="u1"))

    assert store.pending_count() == 0
    assert (await driver.introspect.get(direct.id)) is not None


async def test_required_refuses_an_enqueue_outside_a_transaction(
    store: MemoryOutboxStore, driver: MemoryDriver, welcome: Any
) -> None:
    with use_outbox(store, driver, mode="required"):
        with pytest.raises(OutboxNoTransactionError) as refused:
            await welcome.enqueue(Signup(user_id="u1"))
        assert refused.value.code == "X_OUTBOX_NO_TX"
        with pytest.raises(OutboxNoTransactionError):
            await welcome.enqueue_many([Signup(user_id="u2")])
        assert driver.live_count() == 0

        # outbox=False is the deliberate bypass (a receiver whose ack must follow a durable row).
        direct = await welcome.enqueue(Signup(user_id="u3"), outbox=False)
        assert (await driver.introspect.get(direct.id)) is not None
        async with store.transaction():
            staged = await welcome.enqueue(Signup(user_id="u4"))
        assert await Relay(store, driver).run_once() == 1
        assert (await driver.introspect.get(staged.id)) is not None


async def test_bad_outbox_arguments_are_refused(
    store: MemoryOutboxStore, driver: MemoryDriver, welcome: Any
) -> None:
    with pytest.raises(JobOptionsInvalidError) as not_installed:
        await welcome.enqueue(Signup(user_id="u1"), outbox=store.begin())
    assert not_installed.value.meta["option"] == "outbox"
    with use_outbox(store, driver):
        with pytest.raises(JobOptionsInvalidError):
            await welcome.enqueue(Signup(user_id="u1"), outbox=True)
        with pytest.raises(DriverRequestInvalidError):
            await welcome.enqueue(Signup(user_id="u1"), outbox=MemoryOutboxStore().begin())
        async with store.transaction():
            with pytest.raises(DriverRequestInvalidError):
                async with store.transaction():
                    pass
    assert driver.live_count() == 0
    assert store.pending_count() == 0


async def test_install_outbox_is_process_wide_until_uninstalled(
    store: MemoryOutboxStore, driver: MemoryDriver
) -> None:
    with pytest.raises(JobOptionsInvalidError):
        install_outbox(store, driver, mode="sometimes")
    try:
        installed = install_outbox(store, driver, mode="required")
        assert installed_outbox() is installed
        with use_outbox(store, driver) as scoped:
            assert installed_outbox() is scoped
        assert installed_outbox() is installed
        assert isinstance(installed.relay(batch=5), Relay)
    finally:
        uninstall_outbox()
    assert installed_outbox() is None


def test_enqueue_sync_stages_on_an_explicit_transaction(registry: JobRegistry) -> None:
    driver = MemoryDriver()
    store = MemoryOutboxStore()
    welcome = welcome_job(registry)
    with use_driver(driver), use_outbox(store, driver):
        tx = store.begin()
        staged = welcome.enqueue_sync(Signup(user_id="u1"), outbox=tx)
        assert store.pending_count() == 0
        asyncio.run(tx.commit())
        assert asyncio.run(Relay(store, driver).run_once()) == 1
        assert asyncio.run(driver.introspect.get(staged.id)) is not None


# --- the relay ----------------------------------------------------------------------------------


async def test_two_relays_together_publish_every_row_exactly_once(
    outbox: Outbox, store: MemoryOutboxStore, driver: MemoryDriver, welcome: Any
) -> None:
    """Side by side (not exclusive), two relays share the lanes and keep each lane's order."""
    staged: list[EnqueueResult] = []
    lanes: dict[str, list[UUID]] = {}
    for batch in range(5):
        async with store.transaction():
            inputs = [Signup(user_id=f"u{batch}-{i}") for i in range(20)]
            results = await welcome.enqueue_many(inputs, order_key=f"lane-{batch % 2}")
        staged += results
        lanes.setdefault(f"lane-{batch % 2}", []).extend(r.id for r in results)
    sides = [Recording(driver), Recording(driver)]
    relays = [Relay(store, side, batch=7, poll_interval="5ms", exclusive=False) for side in sides]
    running = [asyncio.create_task(relay.run()) for relay in relays]
    await drained(store)
    for relay in relays:
        await relay.stop()
    await asyncio.gather(*running)

    published = Counter(answer.id for side in sides for answer in side.answers)
    assert published == Counter(result.id for result in staged)
    assert all(side.answers for side in sides), "both relays took part"
    assert not any(answer.deduped for side in sides for answer in side.answers)
    assert driver.live_count() == 100
    # The memory driver numbers rows as it inserts them: the order they were published in.
    for lane, ids in lanes.items():
        inserted = [driver._m.rows[i].seq for i in ids]
        assert inserted == sorted(inserted), f"{lane} published in staging order"


async def test_a_relay_killed_between_publish_and_mark_never_doubles_a_job(
    outbox: Outbox,
    store: MemoryOutboxStore,
    driver: MemoryDriver,
    clock: ManualClock,
    welcome: Any,
) -> None:
    async with store.transaction():
        staged = await welcome.enqueue_many([Signup(user_id=f"u{i}") for i in range(3)])
    killed = Relay(KilledBeforeMark(store), driver, claim_lease="30s")
    with pytest.raises(RelayKilled):
        await killed.run_once()
    assert driver.live_count() == 3
    assert store.pending_count() == 3

    survivor_side = Recording(driver)
    survivor = Relay(store, survivor_side, claim_lease="30s")
    # The dead relay's claim still holds its rows until the lease lapses.
    assert await survivor.run_once() == 0
    clock.advance("31s")
    assert await survivor.run_once() == 3

    assert [answer.id for answer in survivor_side.answers] == [r.id for r in staged]
    assert all(answer.deduped for answer in survivor_side.answers)
    assert driver.live_count() == 3
    assert store.pending_count() == 0


async def test_a_failed_publish_stops_the_batch_and_releases_the_rest_at_once(
    outbox: Outbox,
    store: MemoryOutboxStore,
    driver: MemoryDriver,
    clock: ManualClock,
    welcome: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    staged: list[EnqueueResult] = []
    for i in range(5):
        async with store.transaction():
            staged.append(await welcome.enqueue(Signup(user_id=f"u{i}")))
        clock.advance("1ms")
    ids = [r.id for r in staged]
    side = Recording(driver, refuse=ids[2])
    relay = Relay(store, side, relay_id="relay-a")

    with caplog.at_level(logging.WARNING, logger="jobs.outbox"):
        assert await relay.run_once() == 2
    assert [a.id for a in side.answers] == ids[:2]
    assert [await driver.introspect.get(i) is not None for i in ids] == [True] * 2 + [False] * 3
    failed = [r for r in caplog.records if r.getMessage() == "jobs.outbox.publish-failed"]
    assert len(failed) == 1
    assert failed[0].job_id == str(ids[2])
    assert failed[0].released == 3
    assert failed[0].code == "X_DRIVER_UNAVAILABLE"

    # Released at once: another relay takes the rows now, no lease to wait out, and stops again.
    other_side = Recording(driver, refuse=ids[2])
    assert await Relay(store, other_side, exclusive=False).run_once() == 0
    assert other_side.answers == []
    # The batch went in one call; refused, it was tried row by row up to the refused row.
    assert other_side.calls == {"enqueue_many": 1, "enqueue": 1}

    side.refuse = None
    assert await relay.run_once() == 3
    assert [a.id for a in side.answers] == ids
    assert store.pending_count() == 0


async def test_stop_joins_the_pass_in_flight(
    outbox: Outbox, store: MemoryOutboxStore, driver: MemoryDriver, welcome: Any
) -> None:
    entered = asyncio.Event()
    gate = asyncio.Event()

    class Held(Recording):
        async def enqueue_many(self, reqs: Any) -> list[EnqueueResult]:
            entered.set()
            await gate.wait()
            return await super().enqueue_many(reqs)

    async with store.transaction():
        staged = await welcome.enqueue(Signup(user_id="u1"))
    relay = Relay(store, Held(driver), poll_interval="5ms")
    running = asyncio.create_task(relay.run())
    await entered.wait()
    stopping = asyncio.create_task(relay.stop())
    for _ in range(10):
        await asyncio.sleep(0)
    assert not stopping.done()

    gate.set()
    await stopping
    assert running.done()
    # The pass finished rather than being cut off: published and marked.
    assert (await driver.introspect.get(staged.id)) is not None
    assert store.pending_count() == 0


async def test_run_logs_a_failing_pass_and_keeps_going(
    outbox: Outbox,
    store: MemoryOutboxStore,
    driver: MemoryDriver,
    welcome: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    class StoreDownOnce:
        def __init__(self, inner: MemoryOutboxStore) -> None:
            self.inner = inner
            self.failures = 1

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        async def claim(self, req: OutboxClaim) -> Any:
            if self.failures:
                self.failures -= 1
                raise ConnectionError("the outbox table is unreachable")
            return await self.inner.claim(req)

    async with store.transaction():
        await welcome.enqueue(Signup(user_id="u1"))
    relay = Relay(StoreDownOnce(store), driver, poll_interval="5ms")
    with caplog.at_level(logging.ERROR, logger="jobs.outbox"):
        running = asyncio.create_task(relay.run())
        await drained(store)
        await relay.stop()
        await running
    assert [r.getMessage() for r in caplog.records] == ["jobs.outbox.relay-failed"]
    assert driver.live_count() == 1


def test_relay_options_are_checked(store: MemoryOutboxStore) -> None:
    driver = MemoryDriver()
    for options in ({"batch": 0}, {"batch": 1001}, {"claim_lease": "0s"}, {"relay_id": ""}):
        with pytest.raises(JobOptionsInvalidError) as refused:
            Relay(store, driver, **options)
        assert refused.value.meta["option"] == next(iter(options))


# --- the memory store ---------------------------------------------------------------------------


async def test_memory_store_orders_leases_and_fences_on_the_claim_token(
    store: MemoryOutboxStore, clock: ManualClock, welcome: Any
) -> None:
    reqs = [welcome.build_request(Signup(user_id=f"u{i}")) for i in range(3)]
    ids = [req.id for req in reqs]
    async with store.transaction() as tx:
        await store.stage_many(reqs, tx)
    # The stored input is a copy: mutating the request's input afterwards changes nothing.
    reqs[0].input["user_id"] = "changed"

    a = await store.claim(OutboxClaim("relay-a", 2, 1_000))
    assert [row.request.id for row in a] == ids[:2]
    assert a[0].request.input["user_id"] == "u0"
    # A row staged after rows another claim holds is not taken: it would overtake them.
    assert await store.claim(OutboxClaim("relay-b", 5, 1_000)) == []
    # Another claim's token moves nothing.
    await store.release(ids[:2], "relay-b-token")
    assert await store.claim(OutboxClaim("relay-c", 5, 1_000)) == []

    clock.advance("1001ms")
    c = await store.claim(OutboxClaim("relay-c", 5, 1_000))
    assert [row.request.id for row in c] == ids
    assert await store.mark_published(ids, a[0].token) == 0
    assert await store.mark_published(ids, c[0].token) == 3
    assert store.pending_count() == 0

    for bad in (OutboxClaim("", 1, 1), OutboxClaim("r", 0, 1), OutboxClaim("r", 1, 0)):
        with pytest.raises(DriverRequestInvalidError):
            await store.claim(bad)


async def test_memory_store_refuses_what_it_cannot_hold(
    store: MemoryOutboxStore, welcome: Any
) -> None:
    req = welcome.build_request(Signup(user_id="u1"))
    with pytest.raises(DriverRequestInvalidError):
        await store.stage(req, object())
    tx = store.begin()
    with pytest.raises(DriverRequestInvalidError):
        await store.stage(EnqueueRequest(**{**_fields(req), "input": {"x": {1, 2}}}), tx)
    await tx.rollback()
    with pytest.raises(DriverRequestInvalidError):
        await store.stage(req, tx)
    with pytest.raises(DriverRequestInvalidError):
        await tx.commit()
    assert store.pending_count() == 0


def _fields(req: EnqueueRequest) -> dict[str, Any]:
    return {name: getattr(req, name) for name in EnqueueRequest.__dataclass_fields__}


# --- the command --------------------------------------------------------------------------------


def test_jobs_relay_refuses_the_memory_driver_and_says_why() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "jobs_core.cli", "relay", "--driver", "memory://"],
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert "X_NOT_IMPLEMENTED" in done.stderr
    assert "Relay(store, driver)" in done.stderr

    app = jobs_cli.create_app(plugins=False)
    shown = CliRunner().invoke(app, ["relay", "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0
    assert "in-process" in shown.output


def test_jobs_dev_runs_a_relay_for_the_outbox_app_installed(store: MemoryOutboxStore) -> None:
    driver = MemoryDriver()
    assert not any(isinstance(role, Relay) for role in jobs_cli._dev_roles(driver))
    try:
        install_outbox(store, driver)
        relays = [role for role in jobs_cli._dev_roles(driver) if isinstance(role, Relay)]
    finally:
        uninstall_outbox()
    assert len(relays) == 1
    assert (relays[0].store, relays[0].driver) == (store, driver)
