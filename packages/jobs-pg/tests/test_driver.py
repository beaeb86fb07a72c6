"""The pg driver's statements, one behaviour at a time, against the real server."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from jobs_core.driver import (
    CAPABILITIES,
    BackfillLedger,
    EventBus,
    EventQuery,
    Introspector,
    JobDriver,
    LeaderLease,
    LeaseRequest,
    LeaseStore,
    OutboxStore,
    PublishRequest,
    RetentionStore,
    SchedulerState,
    StepStore,
    WakeSource,
    WorkerRegistry,
    open_driver,
)
from jobs_core.errors import (
    DriverRequestInvalidError,
    DriverUnavailableError,
    JobDuplicateError,
    JobPageInvalidError,
)
from jobs_core.ids import new_id
from jobs_core.testing import ManualClock
from jobs_core.types import (
    LEASE_LAPSED_FINAL_ATTEMPT,
    BuriedJob,
    ErrorInfo,
    Fence,
    JobFilter,
    JobState,
    NackOptions,
    OutboxClaim,
    Settle,
    StepRecord,
    StepWrite,
    TaskFire,
    WorkerInfo,
)
from jobs_pg import PostgresDriver, open_postgres_driver, transaction
from jobs_pg._db import refused_value
from pg_helpers import claim, info, request

# --- opening ---------------------------------------------------------------------------------


def test_the_entry_point_answers_synchronously_and_reads_url_options(pg_url: str) -> None:
    driver = open_driver(f"{pg_url}?schema=app_jobs&max_size=3")
    assert isinstance(driver, PostgresDriver)
    assert driver.schema == "app_jobs"
    assert driver._db.pool.max_size == 3
    assert "schema" not in str(driver._db.pool.conninfo)
    assert isinstance(open_driver(pg_url.replace("postgresql://", "postgres://")), PostgresDriver)
    for bad in ("redis://x", f"{pg_url}?schema=1bad", f"{pg_url}?max_size=many"):
        with pytest.raises(DriverRequestInvalidError):
            open_postgres_driver(bad)
    with pytest.raises(DriverRequestInvalidError):
        open_postgres_driver(pg_url, pool_recycle=3)


async def test_the_entry_point_driver_opens_its_pool_on_first_use(url: str, migrated: str) -> None:
    driver = open_driver(url)
    try:
        assert (await driver.enqueue(request("k"))).deduped is False
        assert [s.queue for s in await driver.stats()] == ["default"]
    finally:
        await driver.close()


def test_sync_enqueues_through_the_entry_point_return_and_the_process_exits(
    url: str, migrated: str
) -> None:
    """Each ``enqueue_sync`` runs in a loop of its own. The first one used to end while the pool
    still set up its second connection: psycopg-pool retried the cancelled set-up and the call
    never returned."""
    script = textwrap.dedent(
        f"""
        from pydantic import BaseModel
        from jobs_core import install_driver, job, open_driver

        class Org(BaseModel):
            org_id: str

        @job(input=Org, idempotency_key=lambda i: i.org_id, tenant="none", name="sync.onboard")
        async def onboard(input, step, ctx): ...

        install_driver(open_driver({url!r}))
        print(onboard.enqueue_sync(Org(org_id="a")).deduped, flush=True)
        print(onboard.enqueue_sync(Org(org_id="a")).deduped, flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout) == (0, "False\nTrue\n"), done.stderr
    assert "error connecting" not in done.stderr


async def test_protocols_capabilities_and_describe(driver: PostgresDriver) -> None:
    assert isinstance(driver, JobDriver)
    for store, protocol in (
        (driver.steps, StepStore),
        (driver.introspect, Introspector),
        (driver.leases, LeaseStore),
        (driver.events, EventBus),
        (driver.wake, WakeSource),
        (driver.outbox, OutboxStore),
        (driver.scheduler_state, SchedulerState),
        (driver.leader, LeaderLease),
        (driver.workers, WorkerRegistry),
        (driver.backfills, BackfillLedger),
        (driver.retention, RetentionStore),
    ):
        assert isinstance(store, protocol), protocol
    described = driver.describe()
    assert described["name"] == "postgresql"
    assert described["not_applicable"] == []
    assert set(described["capabilities"]) == set(CAPABILITIES)


async def test_an_unreachable_server_is_unavailable_fast(migrated: str) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(DriverUnavailableError) as raised:
        await PostgresDriver.connect(
            "postgresql://postgres@127.0.0.1:1/test?connect_timeout=1", timeout=1.0
        )
    assert raised.value.code == "X_DRIVER_UNAVAILABLE"
    assert loop.time() - started < 5


async def test_every_call_after_close_is_unavailable(driver_factory: Any) -> None:
    driver = await driver_factory()
    await driver.enqueue(request("k"))
    await driver.close()
    await driver.close()
    for call in (
        driver.enqueue(request("x")),
        claim(driver),
        driver.stats(),
        driver.steps.load(new_id()),
        driver.introspect.list(JobFilter()),
        driver.leases.holders("k"),
        driver.wake.subscribe(print),
    ):
        with pytest.raises(DriverUnavailableError):
            await call


# --- enqueue ---------------------------------------------------------------------------------


async def test_enqueue_many_over_a_thousand_rows_keeps_order_and_dedupes(
    driver: PostgresDriver,
) -> None:
    reqs = [request(f"k{i % 2_400}") for i in range(2_500)]
    results = await driver.enqueue_many(reqs)
    assert [r.deduped for r in results] == [False] * 2_400 + [True] * 100
    assert [r.id for r in results[2_400:]] == [r.id for r in results[:100]]
    assert [r.id for r in results[:2_400]] == [req.id for req in reqs[:2_400]]
    [stats] = await driver.stats()
    assert stats.ready == 2_400


async def test_a_repeated_explicit_id_in_one_batch_meets_the_first(driver: PostgresDriver) -> None:
    job_id = new_id()
    first, again, other = await driver.enqueue_many(
        [request("a", job_id=job_id), request("b", job_id=job_id), request("c")]
    )
    assert (first.id, first.deduped) == (job_id, False)
    assert (again.id, again.run_id, again.deduped) == (job_id, first.run_id, True)
    assert not other.deduped
    assert (await info(driver, job_id)).idempotency_key == "a"


async def test_the_enqueue_statement_is_planned_once_per_connection(
    pg_url: str, migrated: str
) -> None:
    """A prepared enqueue keeps its generic plan: single enqueues and batches are not re-planned.

    Typed arrays unnested showed the planner the batch size, so every single enqueue was
    planned again (custom plan), and a 1,000-row plan was costly enough to be JIT-compiled.
    """
    driver = PostgresDriver(pg_url, schema=migrated, min_size=1, max_size=1)
    try:
        for i in range(10):
            await driver.enqueue(request(f"one-{i}"))
        for b in range(5):
            await driver.enqueue_many([request(f"many-{b}-{i}") for i in range(200)])
        async with driver._db.connection() as conn:
            cur = await conn.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE statement LIKE %s",
                ("%INSERT INTO%jobs%ON CONFLICT DO NOTHING%",),
            )
            [(generic, custom)] = await cur.fetchall()
        # Postgres tries five custom plans before it compares them with the generic one.
        assert custom <= 5
        assert generic >= 10
    finally:
        await driver.close()


async def test_a_new_pool_connection_plans_the_hot_statements_before_it_is_lent(
    pg_url: str, migrated: str
) -> None:
    """The first enqueue, claim and ack on a connection reuse a generic plan; the warm-up that
    made it wrote nothing.

    Cold, a connection's first enqueue took ~5.5 ms (catalog loads, planning) against ~1.4 ms,
    and its next five were planned for their parameters (+0.3 ms each): a pickup probe paid both.
    """
    driver = PostgresDriver(pg_url, schema=migrated, min_size=1, max_size=1)
    plans = (
        "SELECT name, generic_plans, custom_plans"
        " FROM pg_prepared_statements WHERE statement ~ %s ORDER BY 1"
    )
    hot = "INSERT INTO .*ON CONFLICT DO NOTHING|claim_waiting|SET state = 'done'"
    try:
        async with driver._db.connection() as conn:
            before = await (await conn.execute(plans, (hot,))).fetchall()
            cur = await conn.execute(
                f'SELECT (SELECT count(*) FROM "{migrated}".jobs),'
                f' (SELECT count(*) FROM "{migrated}".counters),'
                f' (SELECT count(*) FROM "{migrated}".wake_slots)'
            )
            assert await cur.fetchone() == (0, 0, 0)
        assert len(before) == 3
        assert all(generic == 1 for _, generic, _ in before)
        await driver.enqueue(request("warm"))
        [claimed] = await claim(driver)
        # A worker's ack always carries the body's duration (its parameter types are the
        # warm-up's then).
        assert await driver.ack(claimed.id, Settle(claimed.fence, duration_ms=1.5))
        async with driver._db.connection() as conn:
            after = await (await conn.execute(plans, (hot,))).fetchall()
        # Each ran once more, on its generic plan: no statement was planned for its call.
        assert [(g, c) for _, g, c in after] == [(g + 1, c) for _, g, c in before]
    finally:
        await driver.close()


async def test_a_warm_up_that_cannot_finish_never_keeps_a_connection_from_the_pool(
    pg_url: str, migrated: str
) -> None:
    """A lock held on ``jobs`` or a tiny ``statement_timeout`` ends the warm-up; the connection
    is still lent (before, the pool discarded it and dialled again until callers timed out)."""
    async with await psycopg.AsyncConnection.connect(pg_url) as holder:
        # SHARE mode (a non-concurrent CREATE INDEX) blocks the warm-up's inserts and updates.
        await holder.execute(f'LOCK TABLE "{migrated}".jobs IN SHARE MODE')
        driver = PostgresDriver(pg_url, schema=migrated, min_size=1, max_size=1, timeout=2)
        try:
            async with driver._db.connection() as conn:
                cur = await conn.execute("SHOW lock_timeout")
                assert await cur.fetchone() == ("0",)  # the session's own value is back
            assert await driver.stats() == []
        finally:
            await driver.close()
    tight = f"{pg_url}?options=-c%20statement_timeout%3D1"
    driver = PostgresDriver(tight, schema=migrated, min_size=1, max_size=1, timeout=2)
    try:
        async with driver._db.connection() as conn:
            cur = await conn.execute("SHOW statement_timeout")
            assert await cur.fetchone() == ("1ms",)
    finally:
        await driver.close()


async def test_the_warm_up_claims_nothing_whatever_the_queue_name(
    pg_url: str, migrated: str
) -> None:
    """The warm-up's claim takes at most 0 rows: even a row in the empty queue (only raw SQL can
    make one; the driver refuses that name) is left as it was."""
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute(
            f'INSERT INTO "{migrated}".jobs (id, run_id, name, queue, input, idempotency_key,'
            " state, max_attempts, run_at, created_at, updated_at)"
            " VALUES (gen_random_uuid(), gen_random_uuid(), 'job', '', 'null', 'k', 'ready', 3,"
            " now(), now(), now())"
        )
        driver = PostgresDriver(pg_url, schema=migrated, min_size=2, max_size=2)
        try:
            async with driver._db.connection(), driver._db.connection():
                pass
        finally:
            await driver.close()
        cur = await conn.execute(f'SELECT state, attempts, claim FROM "{migrated}".jobs')
        assert await cur.fetchall() == [("ready", 0, 0)]


async def test_pool_connections_never_jit_compile(driver: PostgresDriver) -> None:
    """JIT is off on every pool connection.

    A 1,000-row enqueue's plan once crossed ``jit_above_cost`` and spent most of its time
    compiling.
    """
    async with driver._db.connection() as conn:
        cur = await conn.execute("SHOW jit")
        assert await cur.fetchone() == ("off",)


@pytest.mark.parametrize(
    "payload",
    [None, "text", 0, 12345678901234567890123, 1.5, [], {"a": [1, {"b": None}], "é": "\\u0000"}],
)
async def test_every_json_input_round_trips(driver: PostgresDriver, payload: Any) -> None:
    """A JSON null input is stored as JSON null (not refused), a literal backslash-u0000 kept."""
    [result] = await driver.enqueue_many([replace(request("k"), input=payload)])
    assert (await info(driver, result.id)).input == payload


async def test_concurrent_enqueuers_of_one_key_make_one_live_row(
    driver_factory: Any,
) -> None:
    """FIELD-FAILURES C27 (variant 3): 20 enqueuers of key K at once, on 4 connections."""
    drivers = [await driver_factory() for _ in range(4)]
    try:
        results = await asyncio.gather(*(drivers[i % 4].enqueue(request("K")) for i in range(20)))
        assert len({r.id for r in results}) == 1
        assert sum(not r.deduped for r in results) == 1
        [job] = await claim(drivers[0])
        # While it runs, and while it waits in retry backoff, K stays held (C27 variants 1, 2).
        assert (await drivers[1].enqueue(request("K"))).id == job.id
        await drivers[0].nack(job.id, NackOptions(job.fence, delay_ms=60_000))
        assert (await drivers[2].enqueue(request("K"))).id == job.id
    finally:
        for driver in drivers:
            await driver.close()


@pytest.mark.parametrize(
    "payload",
    [{"nul": "a\u0000b"}, {"a\u0000": 1}, {"nan": float("nan")}, {"set": {1}}],
)
async def test_a_payload_no_driver_can_store_is_refused_before_writing(
    driver: PostgresDriver, payload: Any
) -> None:
    """FIELD-FAILURES C22: refused at enqueue with a clear error, never after "enqueued"."""
    with pytest.raises(DriverRequestInvalidError):
        await driver.enqueue_many([request("fine"), request("k", payload=payload)])
    assert await driver.stats() == []


async def test_nul_in_keys_and_names_is_refused(driver: PostgresDriver) -> None:
    for bad in (request("a\u0000b"), request("k", tenant="t\u0000"), request("k", queue="q\x00")):
        with pytest.raises(DriverRequestInvalidError):
            await driver.enqueue(bad)
    assert await driver.stats() == []


async def test_a_value_the_server_refuses_is_refused_without_its_message(
    pg_url: str, driver: PostgresDriver
) -> None:
    """The server's message quotes the value (``Token "..." is invalid``); ours never does."""
    secret = "s3cr3tpayload"
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        with pytest.raises(psycopg.DataError) as raw:
            await conn.execute("SELECT %s::jsonb", (f'{{"card": {secret}}}',))
    assert secret in str(raw.value), "the server's own message quotes it"
    refused = refused_value(raw.value)
    assert refused.code == "X_DRIVER_REQUEST_INVALID"
    assert secret not in str(refused) and refused.meta["sqlstate"] == raw.value.sqlstate
    with pytest.raises(DriverRequestInvalidError) as through:
        await driver.enqueue(request("huge", delay_ms=10**18, payload={"card": secret}))
    assert "SQLSTATE" in str(through.value) and secret not in str(through.value)
    assert through.value.__cause__ is None and through.value.__suppress_context__


async def test_odd_delays_and_instants(timed: PostgresDriver, clock: ManualClock) -> None:
    """FIELD-FAILURES C24: negative and past run now, out of range is refused, no busy loop."""
    now = clock.now()
    due_now = [
        request("neg", delay_ms=-1),
        request("neg-day", delay_ms=-86_400_000),
        request("epoch", run_at=datetime(1970, 1, 1, tzinfo=UTC)),
        request("pre-epoch", run_at=datetime(1900, 1, 1, tzinfo=UTC)),
    ]
    for result in await timed.enqueue_many(due_now):
        row = await info(timed, result.id)
        assert (row.state, row.run_at) == (JobState.READY, now)
    far = await timed.enqueue(request("y9999", run_at=datetime(9999, 1, 1, tzinfo=UTC)))
    assert (await info(timed, far.id)).state is JobState.DELAYED
    with pytest.raises(DriverRequestInvalidError):
        await timed.enqueue(request("huge", delay_ms=10**18))
    with pytest.raises(DriverRequestInvalidError):
        await timed.enqueue(request("naive", run_at=datetime(2030, 1, 1)))
    assert len(await claim(timed, limit=10)) == 4


# --- claim and settle ------------------------------------------------------------------------


async def test_claim_merges_queues_oldest_first_and_skips_paused(
    timed: PostgresDriver, clock: ManualClock
) -> None:
    x1 = await timed.enqueue(request("x1", queue="x"))
    clock.advance(1)
    y1 = await timed.enqueue(request("y1", queue="y"))
    clock.advance(1)
    x2 = await timed.enqueue(request("x2", queue="x"))
    await timed.enqueue(request("z1", queue="z"))
    await timed.introspect.pause_queue("z")
    claimed = await claim(timed, "y", "x", "x", "z", limit=10)
    assert [j.id for j in claimed] == [x1.id, y1.id, x2.id]
    assert [j.claim for j in claimed] == [1, 1, 1]


async def test_a_lapsed_lease_is_reclaimed_and_the_stale_claim_fenced(
    timed: PostgresDriver, clock: ManualClock
) -> None:
    """FIELD-FAILURES C01/C05 at the statement level."""
    result = await timed.enqueue(request("k", max_attempts=3))
    [first] = await claim(timed, vt=1_000, worker="w1")
    clock.advance(999)
    assert await claim(timed, worker="w2") == []
    clock.advance(1)
    [second] = await claim(timed, vt=1_000, worker="w2")
    assert (second.id, second.attempt, second.claim) == (result.id, 2, 2)
    step = StepWrite(first.id, first.fence, first.run_id, StepRecord("s", "completed"))
    assert not await timed.ack(first.id, Settle(first.fence))
    assert not await timed.nack(first.id, NackOptions(first.fence, dead_letter=True))
    assert not await timed.heartbeat(first.id, first.fence, 1_000)
    assert not await timed.introspect.record_progress(first.id, first.fence, 1)
    assert not await timed.steps.write(step)
    assert await timed.ack(second.id, Settle(second.fence, result={"by": "w2"}))
    row = await info(timed, result.id)
    assert (row.state, row.attempt, row.result, row.steps) == (JobState.DONE, 2, {"by": "w2"}, ())


async def test_a_claim_skips_the_lapse_scan_while_no_lease_lapsed(driver: PostgresDriver) -> None:
    """Settled rows leave dead entries in ``jobs_lapse``: only the probe walks them, not the arm.

    Without autovacuum the lapsed arm (a bitmap scan) fetched every dead row version behind the
    index at every claim: 30 ms per claim after 200k jobs. The probe's ordered index walk marks
    the entries dead as it passes them, and the arm runs only when the probe found a lapse.
    """
    await driver.enqueue_many([request(f"k{i}") for i in range(50)])
    for job in await claim(driver, limit=50):
        assert await driver.ack(job.id, Settle(job.fence))
    await driver.enqueue(request("held"))
    [held] = await claim(driver, vt=60_000)
    db = driver._db
    params = db.params(
        {
            "queues": ["default"],
            "limit": 10,
            "lease_ms": 30_000,
            "worker": "w1",
            "drop": [],
            "reason": LEASE_LAPSED_FINAL_ATTEMPT,
        }
    )
    async with db.connection() as conn, conn.transaction(force_rollback=True):
        cur = await conn.execute(b"EXPLAIN (ANALYZE) " + db.statements["claim"], params)
        plan = [row[0] for row in await cur.fetchall()]
    probe = [line for line in plan if "jobs_lapse on jobs probe" in line]
    arm = [line for line in plan if "jobs_lapse" in line and line not in probe]
    assert probe and "never executed" not in probe[0]
    assert arm and all("never executed" in line for line in arm)
    assert await driver.ack(held.id, Settle(held.fence))


async def test_a_claim_walks_the_claim_index_whatever_the_statistics(
    driver: PostgresDriver,
) -> None:
    """A backlog the planner has no column statistics for is still claimed oldest-first cheaply.

    VACUUM without ANALYZE (what a server sees after a bulk fill when only VACUUM ran) leaves the
    row count right but the column statistics empty: the planner then estimated the waiting arm
    at 2 rows of 100k, scanned them all by bitmap and sorted them at every claim (1.5 s per
    claim at 1M). A claim must touch the pages of the rows it takes, not of the backlog.
    """
    db = driver._db
    async with db.connection() as conn:
        await conn.execute(
            f'ALTER TABLE "{db.schema}".jobs SET (autovacuum_enabled = false)'  # type: ignore[arg-type]
        )
    for start in range(0, 100_000, 5_000):
        await driver.enqueue_many([request(f"k{i}") for i in range(start, start + 5_000)])
    async with db.connection() as conn:
        await conn.execute(f'VACUUM "{db.schema}".jobs')  # type: ignore[arg-type]
    params = db.params(
        {
            "queues": ["default"],
            "limit": 32,
            "lease_ms": 30_000,
            "worker": "w1",
            "drop": [],
            "reason": LEASE_LAPSED_FINAL_ATTEMPT,
        }
    )
    async with db.connection() as conn, conn.transaction(force_rollback=True):
        explain = b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + db.statements["claim"]
        cur = await conn.execute(explain, params)
        [[[plan]]] = await cur.fetchall()
    touched = plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"]
    assert plan["Plan"]["Actual Rows"] == 32
    # 32 claimed rows: their index and heap pages, the updates' new versions and index entries
    # (~700 pages measured); the backlog's heap alone is ~2,900 pages.
    assert touched < 1_500, f"the claim touched {touched} pages"
    [first] = await claim(driver, limit=1)
    assert first.idempotency_key == "k0"


@pytest.mark.parametrize(("dropped", "state"), [(False, JobState.DEAD), (True, JobState.FAILED)])
async def test_a_final_attempt_lapse_is_buried_in_the_claim_statement(
    timed: PostgresDriver, clock: ManualClock, dropped: bool, state: JobState
) -> None:
    crasher = await timed.enqueue(request("k", name="crasher", max_attempts=1))
    fine = await timed.enqueue(request("fine", name="fine"))
    await claim(timed, vt=1_000, limit=1)
    clock.advance(1_000)
    told: list[BuriedJob] = []
    handed = await claim(
        timed,
        drop_exhausted=frozenset({"crasher"}) if dropped else frozenset(),
        on_exhausted=told.append,
    )
    assert [j.id for j in handed] == [fine.id]
    assert told == [BuriedJob(crasher.id, "crasher", "default", state)]
    buried = await info(timed, crasher.id)
    assert (buried.state, buried.attempt, buried.last_error) == (
        state,
        1,
        LEASE_LAPSED_FINAL_ATTEMPT,
    )
    [total] = (await timed.counters.totals(clock.now() - timedelta(hours=1))).values()
    assert (total.dead, total.failed) == ((0, 1) if dropped else (1, 0))


async def test_acks_in_flight_together_are_each_fenced(driver: PostgresDriver) -> None:
    await driver.enqueue_many([request(f"k{i}") for i in range(300)])
    jobs = await claim(driver, limit=300)
    stale = [Settle(Fence("intruder", j.claim)) for j in jobs[:50]]
    answers = await asyncio.gather(
        *(driver.ack(j.id, s) for j, s in zip(jobs[:50], stale, strict=True)),
        *(driver.ack(j.id, Settle(j.fence, result=i)) for i, j in enumerate(jobs)),
        # The same fence twice at once: exactly one ack lands.
        driver.ack(jobs[-1].id, Settle(jobs[-1].fence)),
    )
    assert answers[:50] == [False] * 50
    assert answers[50:350] == [True] * 300
    assert answers[350] is False
    [stats] = await driver.stats()
    assert (stats.done, stats.running) == (300, 0)
    assert (await info(driver, jobs[7].id)).result == 7


async def test_nack_states_errors_and_counters(timed: PostgresDriver, clock: ManualClock) -> None:
    await timed.enqueue_many([request(f"k{i}") for i in range(4)])
    a, b, c, d = await claim(timed, limit=4)
    error = ErrorInfo("boom", code="X_APP", stack="Traceback ...")
    assert await timed.nack(a.id, NackOptions(a.fence, error=error, delay_ms=2_000))
    assert await timed.nack(b.id, NackOptions(b.fence, park=True, delay_ms=5_000))
    assert await timed.nack(c.id, NackOptions(c.fence, fail=True))
    assert await timed.nack(d.id, NackOptions(d.fence, dead_letter=True, count_attempt=False))
    rows = {j.id: await info(timed, j.id) for j in (a, b, c, d)}
    assert [(rows[j.id].state, rows[j.id].attempt) for j in (a, b, c, d)] == [
        (JobState.DELAYED, 1),
        (JobState.SUSPENDED, 0),
        (JobState.FAILED, 1),
        (JobState.DEAD, 0),
    ]
    assert (rows[a.id].last_error_code, rows[a.id].run_at) == (
        "X_APP",
        clock.now() + timedelta(seconds=2),
    )
    [total] = (await timed.counters.totals(clock.now() - timedelta(minutes=1))).values()
    assert (total.retried, total.failed, total.dead, total.done) == (1, 1, 1, 0)


async def test_stats_demand_and_the_keda_query_agree(
    timed: PostgresDriver, clock: ManualClock
) -> None:
    await timed.enqueue_many([request(f"r{i}") for i in range(3)])
    await timed.enqueue(request("later", delay_ms=10_000))
    await timed.enqueue(request("p1", queue="paused"))
    await timed.introspect.pause_queue("paused")
    clock.advance(1_000)
    await claim(timed, limit=2, vt=5_000)
    stats = {s.queue: s for s in await timed.stats()}
    d = stats["default"]
    assert (d.ready, d.delayed, d.running, d.oldest_ready_ms) == (1, 1, 2, 1_000)
    assert await timed.demand() == {"default": 3, "paused": 0}


# --- steps and events ------------------------------------------------------------------------


async def test_step_writes_number_replace_and_hold_the_fence(driver: PostgresDriver) -> None:
    await driver.enqueue(request("k"))
    [job] = await claim(driver)

    def write(record: StepRecord) -> StepWrite:
        return StepWrite(job.id, job.fence, job.run_id, record)

    assert await driver.steps.write(write(StepRecord("a", "completed", output={"n": 1})))
    assert await driver.steps.write(write(StepRecord("b", "failed", attempts=1, error="x")))
    assert await driver.steps.write(write(StepRecord("b", "completed", output=[2], seq=99)))
    wait = StepRecord("w", "waiting", event="paid", match={"order": 7})
    assert await driver.steps.write(write(wait))
    steps = await driver.steps.load(job.run_id)
    assert [(s.name, s.seq, s.status, s.output) for s in steps] == [
        ("a", 0, "completed", {"n": 1}),
        ("b", 1, "completed", [2]),
        ("w", 2, "waiting", None),
    ]
    assert steps[2].match == {"order": 7}
    with pytest.raises(DriverRequestInvalidError):
        await driver.steps.write(StepWrite(job.id, None, job.run_id, StepRecord("x", "started")))
    # Another run under this job's fence does not hold.
    assert not await driver.steps.write(
        StepWrite(job.id, job.fence, new_id(), StepRecord("e", "completed"))
    )


async def test_a_publish_wakes_matching_waiters_in_its_statement(
    timed: PostgresDriver, clock: ManualClock
) -> None:
    waiting = await timed.enqueue(request("waiting"))
    other = await timed.enqueue(request("other"))
    for job in await claim(timed, limit=2):
        match = {"order": 7} if job.id == waiting.id else {"order": 8}
        record = StepRecord("wait", "waiting", started_at=clock.now(), event="paid", match=match)
        await timed.steps.write(StepWrite(job.id, job.fence, job.run_id, record))
        await timed.nack(job.id, NackOptions(job.fence, park=True, delay_ms=900_000))
    clock.advance(10)
    event = await timed.events.publish(PublishRequest("paid", {"order": 7, "x": 1}, None, 60_000))
    assert event.published_at == clock.now()
    assert (await info(timed, waiting.id)).run_at == clock.now()
    assert (await info(timed, other.id)).run_at == clock.now() + timedelta(seconds=899.99)
    [woken] = await claim(timed)
    assert (woken.id, woken.attempt, woken.claim) == (waiting.id, 1, 2)


# --- leases (C28), scheduler, leader, workers, counters --------------------------------------


async def test_concurrent_acquirers_never_exceed_the_limit(driver_factory: Any) -> None:
    """FIELD-FAILURES C28: the capacity check and the take are atomic across connections."""
    drivers = [await driver_factory() for _ in range(5)]
    try:
        for limit in (1, 3):
            key = f"job:limited-{limit}"
            got = await asyncio.gather(
                *(
                    drivers[i % 5].leases.acquire(LeaseRequest(key, limit, f"r{i}", 60_000))
                    for i in range(40)
                )
            )
            assert sum(got) == limit
            assert len(await drivers[0].leases.holders(key)) == limit
    finally:
        for driver in drivers:
            await driver.close()


async def test_lease_slots_expire_and_keep_acquisition_order(
    timed: PostgresDriver, clock: ManualClock
) -> None:
    def req(holder: str, ttl: int = 1_000) -> LeaseRequest:
        return LeaseRequest("job:send", 2, holder, ttl)

    assert await timed.leases.acquire(req("r1"))
    clock.advance(100)
    assert await timed.leases.acquire(req("r2"))
    assert not await timed.leases.acquire(req("r3"))
    clock.advance(950)  # r1 lapsed; r2 holds until +1100
    assert await timed.leases.acquire(req("r3"))
    assert await timed.leases.holders("job:send") == ["r2", "r3"]
    assert not await timed.leases.renew(req("r1"))
    await timed.leases.release("job:send", "r2")
    assert await timed.leases.holders("job:send") == ["r3"]


async def test_two_schedulers_fire_one_occurrence_once(driver_factory: Any) -> None:
    one, two = await driver_factory(), await driver_factory()
    try:
        at = datetime(2030, 1, 1, 3, tzinfo=UTC)

        def fire(expected: datetime | None, occurrence: datetime) -> TaskFire:
            return TaskFire("nightly", occurrence, expected, (request(f"n:{occurrence}"),))

        first, second = await asyncio.gather(
            one.scheduler_state.fire(fire(None, at)), two.scheduler_state.fire(fire(None, at))
        )
        assert sorted([first is None, second is None]) == [False, True]
        assert await one.scheduler_state.watermarks() == {"nightly": at}
        [record] = await one.scheduler_state.task_fires()
        landed = first or second
        assert landed is not None and record.job_ids == (landed[0].id,)
        # A fire whose enqueue the driver refuses writes nothing, watermark included.
        later = at + timedelta(days=1)
        bad = TaskFire("nightly", later, at, (request("bad", payload={"x": float("inf")}),))
        with pytest.raises(DriverRequestInvalidError):
            await one.scheduler_state.fire(bad)
        assert await one.scheduler_state.watermarks() == {"nightly": at}
        assert not await two.scheduler_state.advance("nightly", None, later)
        assert await two.scheduler_state.advance("nightly", at, later)
        await one.scheduler_state.pause_task("nightly")
        assert await two.scheduler_state.paused_tasks() == ["nightly"]
        await two.scheduler_state.resume_task("nightly")
        assert await one.scheduler_state.paused_tasks() == []
    finally:
        await one.close()
        await two.close()


async def test_leader_workers_and_counter_rollup(timed: PostgresDriver, clock: ManualClock) -> None:
    assert await timed.leader.acquire("a", 1_000)
    assert not await timed.leader.acquire("b", 1_000)
    clock.advance(1_000)
    assert await timed.leader.acquire("b", 1_000)
    assert await timed.leader.holder() == "b"
    await timed.leader.release("a")
    assert await timed.leader.holder() == "b"

    worker = WorkerInfo("w1", "host", "1.0", clock.now(), ("default",), 8, (new_id(),) * 150)
    await timed.workers.beat(worker, 5_000)
    [listed] = await timed.workers.list()
    assert (len(listed.in_flight), listed.last_heartbeat) == (100, clock.now())
    clock.advance(5_000)
    assert await timed.workers.list() == []

    start = clock.now()
    await timed.enqueue(request("k", name="counted"))
    [job] = await claim(timed)
    assert await timed.ack(job.id, Settle(job.fence, duration_ms=12.5))
    [bucket] = await timed.counters.counters("counted", start - timedelta(hours=1))
    assert (bucket.tier, bucket.done, bucket.duration_ms) == ("1m", 1, 12.5)
    clock.advance(timedelta(hours=25))
    assert await timed.counters.rollup() == 1
    [folded] = await timed.counters.counters("counted", start - timedelta(hours=1))
    assert (folded.tier, folded.done) == ("5m", 1)
    clock.advance(timedelta(days=40))
    assert await timed.counters.rollup() == 2  # 5m into 1h, then 1h dropped
    assert await timed.counters.counters("counted", start - timedelta(hours=1)) == []


# --- operator surface ------------------------------------------------------------------------


async def test_requeue_from_a_step_and_duplicate_keys(driver: PostgresDriver) -> None:
    result = await driver.enqueue(request("k"))
    [job] = await claim(driver)
    for name in ("a", "b", "c"):
        record = StepRecord(name, "completed", output=name)
        await driver.steps.write(StepWrite(job.id, job.fence, job.run_id, record))
    await driver.nack(job.id, NackOptions(job.fence, dead_letter=True))
    with pytest.raises(DriverRequestInvalidError):
        await driver.introspect.requeue(result.id, from_step="missing")
    assert [s.name for s in (await info(driver, result.id)).steps] == ["a", "b", "c"]
    again = await driver.introspect.requeue(result.id, from_step="b")
    assert (again.state, again.attempt, [s.name for s in again.steps]) == (
        JobState.READY,
        0,
        ["a"],
    )
    [job] = await claim(driver)
    await driver.ack(job.id, Settle(job.fence))
    holder = await driver.enqueue(request("k"))
    with pytest.raises(JobDuplicateError):
        await driver.introspect.requeue(result.id)
    assert (await info(driver, holder.id)).state is JobState.READY


async def test_bulk_calls_work_in_thousands_until_zero(driver: PostgresDriver) -> None:
    await driver.enqueue_many([request(f"k{i}", delay_ms=3_600_000) for i in range(1_200)])
    flt = JobFilter(state=JobState.DELAYED)
    first = await driver.introspect.promote_many(flt)
    second = await driver.introspect.promote_many(flt)
    assert (first.affected, first.remaining, second.affected, second.remaining) == (
        1_000,
        200,
        200,
        0,
    )
    removed = await driver.introspect.remove_many(JobFilter())
    assert (removed.affected, removed.remaining) == (1_000, 200)


async def test_listing_refuses_another_drivers_cursor(driver: PostgresDriver) -> None:
    await driver.enqueue_many([request(f"k{i}") for i in range(3)])
    page = await driver.introspect.list(JobFilter(limit=2))
    assert page.next is not None
    rest = await driver.introspect.list(JobFilter(limit=2, after=page.next))
    assert len(rest.rows) == 1 and rest.prev is not None
    for foreign in ("bWVtMXwxfDI", "not-a-cursor"):
        with pytest.raises(JobPageInvalidError):
            await driver.introspect.list(JobFilter(after=foreign))


# --- connection loss -------------------------------------------------------------------------


async def test_killed_pool_connections_are_unavailable_then_replaced(
    driver: PostgresDriver, pg_url: str
) -> None:
    await driver.enqueue(request("before"))
    with psycopg.connect(pg_url, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s",
            (f"jobs-pg:{driver.schema}",),
        ).fetchone()
    assert killed is not None and killed[0] >= 1
    outcomes: list[str] = []
    for key in ("a", "b", "c", "d", "e"):
        try:
            await driver.enqueue(request(key))
            outcomes.append("ok")
        except DriverUnavailableError:
            outcomes.append("unavailable")
        await asyncio.sleep(0.2)
    assert outcomes[-1] == "ok"
    [stats] = await driver.stats()
    # Nothing half-written: every enqueue that answered ok is a row, every failed one is not.
    assert stats.ready == 1 + outcomes.count("ok")


async def test_an_event_published_before_its_waiter_parks_still_wakes_it(
    timed: PostgresDriver, clock: ManualClock
) -> None:
    """The window between a waiting step's last look and its park: the publish marks the
    running row, and the park makes it due now instead of at the 15-minute backstop."""
    result = await timed.enqueue(request("k"))
    [job] = await claim(timed)
    record = StepRecord("wait", "waiting", started_at=clock.now(), event="paid")
    await timed.steps.write(StepWrite(job.id, job.fence, job.run_id, record))
    await timed.events.publish(PublishRequest("paid", {"any": 1}, None, 60_000))
    assert await timed.nack(job.id, NackOptions(job.fence, park=True, delay_ms=900_000))
    assert (await info(timed, result.id)).run_at == clock.now()
    [again] = await claim(timed)
    # The next park, with no event in between, waits its delay again.
    assert await timed.nack(again.id, NackOptions(again.fence, park=True, delay_ms=900_000))
    assert (await info(timed, result.id)).run_at == clock.now() + timedelta(seconds=900)


async def test_staging_and_publishing_join_the_apps_transaction(
    driver: PostgresDriver, pg_url: str
) -> None:
    """An async connection (``async with``) and a sync one (``with``): a rollback leaves no
    staged row and no event, a commit leaves both."""
    start = datetime.now(UTC) - timedelta(minutes=1)
    async with await psycopg.AsyncConnection.connect(pg_url) as aconn:
        with pytest.raises(RuntimeError):
            async with transaction(aconn):
                await driver.outbox.stage(request("rolled-back"), driver.outbox.ambient())
                await driver.events.publish(PublishRequest("gone", {}, None, 60_000))
                raise RuntimeError("the app's transaction failed")
        async with transaction(aconn):
            await driver.outbox.stage(request("async"), aconn)
            await driver.events.publish(PublishRequest("kept", {}, None, 60_000))
    with psycopg.connect(pg_url) as conn:
        with pytest.raises(RuntimeError), transaction(conn):
            await driver.outbox.stage(request("sync-rolled-back"), conn)
            raise RuntimeError("the app's transaction failed")
        with transaction(conn):
            assert driver.outbox.ambient() is conn
            await driver.outbox.stage_many([request("sync-1"), request("sync-2")], conn)
    assert driver.outbox.ambient() is None
    rows = await driver.outbox.claim(OutboxClaim("relay", 10, 30_000))
    assert [row.request.idempotency_key for row in rows] == ["async", "sync-1", "sync-2"]
    assert await driver.events.find(EventQuery("gone", start)) is None
    assert await driver.events.find(EventQuery("kept", start)) is not None
    assert await driver.outbox.mark_published([r.request.id for r in rows], rows[0].token) == 3
    assert await driver.outbox.mark_published([rows[0].request.id], rows[0].token) == 0
    with pytest.raises(DriverRequestInvalidError):
        await driver.outbox.stage(request("k"), object())
