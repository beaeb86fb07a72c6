"""The factories on a real server: keyset pages, a backfill and a consumer whose workers are
SIGKILLed, the retention sweep in bounded batches, rollups across DST, view refreshes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from jobs_core import (
    JobRegistry,
    JobState,
    Retry,
    TaskRegistry,
    consumer,
    job,
    keyset,
    purge,
    retention_targets,
    use_driver,
)
from jobs_core.errors import (
    BackfillSourceInvalidError,
    ConsumerInvalidError,
    RefreshViewInvalidError,
    RollupInvalidError,
)
from jobs_core.testing import ManualClock, run_jobs
from jobs_core.types import BackfillQuery, RetentionRequest
from jobs_pg import Bucket, PgCursorStore, PostgresDriver, refresh_view, rollup
from pg_helpers import APPS, until

PARIS = ZoneInfo("Europe/Paris")


@pytest.fixture
def app(pg_url: str, migrated: str) -> Iterator[str]:
    """The app's tables, in this test's schema (dropped with it): ``"<schema>".name``."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            f'CREATE TABLE "{migrated}".posts (id bigint PRIMARY KEY, org text NOT NULL,'
            " slug text, handled int NOT NULL DEFAULT 0)"
        )
        conn.execute(f'CREATE TABLE "{migrated}".pages (first_id bigint NOT NULL)')
        conn.execute(f'CREATE TABLE "{migrated}".feed (id int PRIMARY KEY)')
        conn.execute(f'CREATE TABLE "{migrated}".sink (id int PRIMARY KEY, n int NOT NULL)')
    yield migrated


def _sql(pg_url: str, text: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        cur = conn.execute(text.encode(), params or None)
        return cur.fetchall() if cur.description else []


# --- keyset -------------------------------------------------------------------------------


async def test_keyset_pages_in_key_order_with_a_filter_and_a_composite_key(
    pg_url: str, app: str
) -> None:
    _sql(
        pg_url,
        f'INSERT INTO "{app}".posts (id, org, slug) SELECT i, CASE WHEN i % 2 = 0 '
        "THEN 'acme' ELSE 'globex' END, CASE WHEN i % 3 = 0 THEN 's' END "
        "FROM generate_series(1, 1050) AS i",
    )
    todo = keyset(pg_url, f"{app}.posts", key="id", where="slug IS NULL")
    assert await todo.count() == 700
    seen: list[int] = []
    cursor: Any = None
    pages = 0
    while True:
        rows, cursor = await todo.read(cursor, 100)
        pages += 1
        seen += [row["id"] for row in rows]
        assert all(row["slug"] is None for row in rows)
        if cursor is None:
            break
        assert cursor == [rows[-1]["id"]], "the cursor is the last key, as JSON"
    # 700 rows: seven full pages, then an empty read that ends the pass.
    assert seen == [i for i in range(1, 1051) if i % 3] and pages == 8
    composite = keyset(
        lambda: psycopg.AsyncConnection.connect(pg_url),
        f"{app}.posts",
        key=("org", "id"),
        where="org = ANY(%(orgs)s)",
        params={"orgs": ["acme", "globex"]},
        columns=["slug"],
    )
    first, after = await composite.read(None, 600)
    assert list(first[0]) == ["org", "id", "slug"]
    # 525 acme rows (the even ids), then the first 75 globex ones (1, 3, ... 149).
    assert after == ["globex", 149] and first[-1] == {"org": "globex", "id": 149, "slug": None}
    rest, end = await composite.read(after, 600)
    assert end is None and len(first) + len(rest) == 1050
    assert (rest[0]["org"], rest[0]["id"]) == ("globex", 151)
    with pytest.raises(BackfillSourceInvalidError):
        keyset(pg_url, "a.b.c", key=())
    with pytest.raises(BackfillSourceInvalidError, match="one value per key"):
        await composite.read([1], 10)


# --- backfill, SIGKILLed mid-pass -----------------------------------------------------------


def _worker(url: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        "-m",
        "jobs_core.cli",
        "worker",
        "pg_factories_app",
        "--driver",
        url,
        "--visibility-timeout",
        "1s",
        "--log-level",
        "warning",
    ]
    full = {**os.environ, "PYTHONPATH": str(APPS), **env}
    return subprocess.Popen(argv, env=full, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_a_backfill_killed_mid_pass_resumes_on_its_page_and_completes_the_ledger(
    pg_url: str, app: str, url: str, driver: PostgresDriver, tmp_path: Path
) -> None:
    """5,000 rows in 20 pages of 250; the first worker is SIGKILLed after some pages. The next
    one resumes on the page the first stopped on: at most one page is handled twice, every row
    is handled, and the ledger row completes with 5,000 rows."""
    from pg_factories_app import posts_backfill

    rows = 5_000
    _sql(
        pg_url,
        f"INSERT INTO \"{app}\".posts (id, org) SELECT i, 'acme' "
        f"FROM generate_series(1, {rows}) AS i",
    )
    env = {"FACTORY_URL": pg_url, "FACTORY_SCHEMA": app}
    os.environ.update(env)
    with use_driver(driver):
        queued = await posts_backfill.enqueue()
    first = _worker(url, env, tmp_path / "worker.log")
    ledger = driver.backfills
    try:

        async def some_pages_done() -> bool:
            found = await ledger.passes(BackfillQuery(name="factories.posts"))
            return bool(found) and found[0].rows >= 1_500

        await until(some_pages_done, timeout=60, every=0.02)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        _stop(first)
    killed_at = (await ledger.passes(BackfillQuery(name="factories.posts")))[0].rows
    assert killed_at < rows, "killed mid-pass"
    second = _worker(url, env, tmp_path / "worker.log")
    try:

        async def settled() -> bool:
            found = await driver.introspect.get(queued.id)
            return found is not None and found.state not in ("ready", "running")

        await until(settled, timeout=90)
    finally:
        _stop(second)
    info = await driver.introspect.get(queued.id)
    assert info is not None and info.state == JobState.DONE, (
        info,
        (tmp_path / "worker.log").read_text(),
    )
    assert info.attempt == 2, "the killed attempt counted, its lease lapsed"
    [done] = await ledger.passes(BackfillQuery(name="factories.posts"))
    assert (done.id, done.status, done.rows, done.last_cursor) == (
        queued.id,
        "completed",
        rows,
        None,
    )
    [(unhandled, twice)] = _sql(
        pg_url,
        f"SELECT count(*) FILTER (WHERE handled = 0), count(*) "
        f'FILTER (WHERE handled > 1) FROM "{app}".posts',
    )
    assert unhandled == 0
    pages = _sql(pg_url, f'SELECT first_id, count(*) FROM "{app}".pages GROUP BY first_id')
    repeated = [first_id for first_id, n in pages if n > 1]
    assert len(pages) == 20 and len(repeated) <= 1, repeated
    assert twice == 250 * len(repeated)


# --- consumer, SIGKILLed at every batch boundary ---------------------------------------------


@pytest.mark.parametrize("point", ["before", "returned", "persisted"])
async def test_a_consumer_killed_at_a_batch_boundary_commits_each_item_once(
    pg_url: str, app: str, url: str, driver: PostgresDriver, tmp_path: Path, point: str
) -> None:
    """SIGKILL before the handler, between its effects and the commit, and after the commit:
    the batch in flight is delivered again when it did not commit, the sink holds each item's
    effect exactly once (n = 1: a rolled-back batch left nothing), and the saved cursor never
    runs ahead of the committed rows."""
    from pg_factories_app import feed_consumer

    _sql(pg_url, f'INSERT INTO "{app}".feed SELECT generate_series(1, 40)')
    effects = tmp_path / "effects.txt"
    env = {
        "FACTORY_URL": pg_url,
        "FACTORY_SCHEMA": app,
        "FACTORY_EFFECTS": str(effects),
        "FACTORY_KILL": f"{point}:batch:1",
    }
    with use_driver(driver):
        queued = await feed_consumer.enqueue({"key": "feed"})
    killed = _worker(url, env, tmp_path / "worker.log")
    assert killed.wait(60) == -signal.SIGKILL, (tmp_path / "worker.log").read_text()
    cursor = _sql(pg_url, f'SELECT cursor FROM "{app}".consumer_cursors')
    committed = {i for (i,) in _sql(pg_url, f'SELECT id FROM "{app}".sink')}
    saved = cursor[0][0] if cursor else 0
    assert committed == set(range(1, saved + 1)), "the cursor never runs ahead of the rows"
    assert saved == {"before": 10, "returned": 10, "persisted": 20}[point]
    rest = _worker(url, {**env, "FACTORY_KILL": ""}, tmp_path / "worker.log")
    try:

        async def settled() -> bool:
            found = await driver.introspect.get(queued.id)
            return found is not None and found.state == JobState.DONE

        await until(settled, timeout=60)
    finally:
        _stop(rest)
    sink = dict(_sql(pg_url, f'SELECT id, n FROM "{app}".sink'))
    assert sink == {i: 1 for i in range(1, 41)}
    assert _sql(pg_url, f'SELECT cursor FROM "{app}".consumer_cursors') == [(40,)]
    batches = [line for line in effects.read_text().splitlines() if line.startswith("batch")]
    delivered_again = len(batches) - len(set(batches))
    assert delivered_again == (1 if point == "returned" else 0), batches


async def test_the_handler_gets_the_transaction_and_a_failure_rolls_back_effects_and_cursor(
    pg_url: str, app: str, driver: PostgresDriver
) -> None:
    store = PgCursorStore(pg_url, schema=app)

    async def feed(cursor: Any, cancel: Any) -> AsyncIterator[int]:
        for item in range(int(cursor or 0) + 1, 6):
            yield item

    async def handle(items: list[int], tx: psycopg.AsyncConnection[Any]) -> int:
        assert tx.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        await tx.execute(f'INSERT INTO "{app}".sink (id, n) SELECT unnest(%s::int[]), 1', [items])
        raise ConnectionError("the vendor's API failed after our writes")

    registry = JobRegistry()
    failing = consumer(
        name="factories.rollback",
        tenant="none",
        keys=lambda: ["k"],
        open=feed,
        handle=handle,
        cursor=store,
        retry=Retry(attempts=1),
        registry=registry,
        task_registry=TaskRegistry(),
    )
    with use_driver(driver):
        queued = await failing.enqueue({"key": "k"})
        await run_jobs(driver, registry=registry, timeout="30s")
    assert (await driver.introspect.get(queued.id)).state == JobState.DEAD  # type: ignore[union-attr]
    assert _sql(pg_url, f'SELECT count(*) FROM "{app}".sink') == [(0,)]
    assert await store.load("factories.rollback", "k") is None
    with pytest.raises(ConsumerInvalidError):
        PgCursorStore(42)


# --- purge: the retention sweep on Postgres ------------------------------------------------


class Counting:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.deleted: list[int] = []

    async def purge_settled(self, req: RetentionRequest) -> int:
        gone = int(await self.inner.purge_settled(req))
        self.deleted.append(gone)
        return gone


async def test_a_retention_sweep_deletes_in_bounded_batches(
    timed: PostgresDriver, clock: ManualClock, pg_url: str, migrated: str
) -> None:
    from pydantic import BaseModel

    class Item(BaseModel):
        n: int

    registry = JobRegistry()

    @job(
        input=Item,
        idempotency_key=lambda i: str(i.n),
        tenant="none",
        name="ret.noop",
        registry=registry,
    )
    async def noop(item: Item, step: Any, ctx: Any) -> None:
        await step.run("one", lambda: item.n)

    counting = Counting(timed.retention)
    sweep = purge(
        name="ret.sweep",
        targets=retention_targets("7d", "30d", driver=timed, batch=1_000, events=False),
        registry=registry,
    )
    timed.retention = counting  # type: ignore[assignment]
    with use_driver(timed):
        for start in range(0, 2_500, 1_000):
            await noop.enqueue_many([Item(n=n) for n in range(start, min(start + 1_000, 2_500))])
        await run_jobs(timed, registry=registry, clock=clock, timeout="60s")
        clock.advance("8d")
        await noop.enqueue(Item(n=9_999))
        run = await sweep.enqueue({})
        await run_jobs(timed, registry=registry, clock=clock, timeout="60s")
        info = await timed.introspect.get(run.id)
    assert info is not None and info.result["removed"] == {"jobs.done": 2_500, "jobs.dead": 0}
    assert counting.deleted == [1_000, 1_000, 500, 0], "one bounded DELETE per call"
    assert _sql(pg_url, f'SELECT count(*) FROM "{migrated}".jobs') == [(2,)]
    # What is left: the newer job's one step and the sweep's own three (now, two targets).
    assert _sql(pg_url, f'SELECT count(*) FROM "{migrated}".job_steps') == [(4,)]
    orphans = _sql(
        pg_url,
        f'SELECT count(*) FROM "{migrated}".job_steps s WHERE NOT EXISTS '
        f'(SELECT 1 FROM "{migrated}".jobs j WHERE j.run_id = s.run_id)',
    )
    assert orphans == [(0,)], "every deleted row's steps went with it"


# --- rollup --------------------------------------------------------------------------------


def _hourly_events(pg_url: str, schema: str, day: date) -> int:
    """One event per local hour of ``day`` in Paris (23, 24 or 25 of them)."""
    start = datetime.combine(day, datetime.min.time(), tzinfo=PARIS).astimezone(UTC)
    end = datetime.combine(day + timedelta(days=1), datetime.min.time(), tzinfo=PARIS)
    instants = []
    at = start
    while at < end.astimezone(UTC):
        instants.append(at + timedelta(minutes=30))
        at += timedelta(hours=1)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.cursor().executemany(
            f'INSERT INTO "{schema}".events_app (at) VALUES (%s)', [(i,) for i in instants]
        )
    return len(instants)


DAILY = (
    "SELECT (%(bucket_start)s::timestamptz AT TIME ZONE 'Europe/Paris')::date AS day, "
    "count(*) AS n FROM {schema}.events_app "
    "WHERE at >= %(bucket_start)s AND at < %(bucket_end)s"
)


@pytest.fixture
def rollup_tables(pg_url: str, migrated: str) -> str:
    _sql(pg_url, f'CREATE TABLE "{migrated}".events_app (at timestamptz NOT NULL)')
    _sql(pg_url, f'CREATE TABLE "{migrated}".days (day date NOT NULL, n bigint NOT NULL)')
    _sql(pg_url, f'CREATE UNIQUE INDEX ON "{migrated}".days (day)')
    return migrated


async def test_a_daily_rollup_in_paris_puts_23_and_25_hours_in_one_bucket_each(
    pg_url: str, rollup_tables: str, driver: PostgresDriver
) -> None:
    schema = rollup_tables
    counts = {
        d: _hourly_events(pg_url, schema, d)
        for d in (
            date(2026, 3, 28),
            date(2026, 3, 29),
            date(2026, 3, 30),
            date(2026, 10, 24),
            date(2026, 10, 25),
            date(2026, 10, 26),
        )
    }
    assert counts[date(2026, 3, 29)] == 23 and counts[date(2026, 10, 25)] == 25
    registry = JobRegistry()
    daily = rollup(
        name="rollup.paris",
        into=f"{schema}.days",
        source_sql=DAILY.format(schema=f'"{schema}"'),
        key="day",
        lookback="2d",
        bucket=Bucket("1d", "Europe/Paris"),
        connect=pg_url,
        registry=registry,
    )
    assert daily.checked, "the unique index was checked at declaration"
    with use_driver(driver):
        spring = await daily.run_inline({"at": datetime(2026, 3, 30, 23, tzinfo=PARIS)})
        autumn = await daily.run_inline({"at": datetime(2026, 10, 26, 23, tzinfo=PARIS)})
        rows = dict(_sql(pg_url, f'SELECT day, n FROM "{schema}".days'))
        assert spring["buckets"] == 3 and autumn["buckets"] == 3
        assert rows == counts
        again = await daily.run_inline({"at": datetime(2026, 10, 26, 23, tzinfo=PARIS)})
    assert again == autumn
    assert dict(_sql(pg_url, f'SELECT day, n FROM "{schema}".days')) == counts, "idempotent"
    spans = Bucket("1d", "Europe/Paris").span(
        datetime(2026, 3, 29, 12, tzinfo=UTC), datetime(2026, 3, 29, 12, tzinfo=UTC)
    )
    [(start, end)] = spans
    assert end - start == timedelta(hours=23)
    hours = Bucket("1h", "Europe/Paris").span(
        datetime(2026, 10, 25, 0, tzinfo=UTC), datetime(2026, 10, 25, 1, 59, tzinfo=UTC)
    )
    assert len(hours) == 2, "the repeated 02:00 is two hour buckets"


async def test_rollup_refusals_name_the_field_and_the_fix(
    pg_url: str, rollup_tables: str, driver: PostgresDriver
) -> None:
    schema = rollup_tables
    registry = JobRegistry()
    _sql(pg_url, f'CREATE TABLE "{schema}".loose (day date, n bigint)')
    options: dict[str, Any] = {
        "source_sql": DAILY.format(schema=f'"{schema}"'),
        "key": "day",
        "lookback": "1d",
        "connect": pg_url,
        "registry": registry,
    }
    with pytest.raises(RollupInvalidError) as no_index:
        rollup(name="r.loose", into=f"{schema}.loose", **options)
    assert no_index.value.code == "X_JOB_ROLLUP_INVALID"
    assert "CREATE UNIQUE INDEX ON" in str(no_index.value) and "into:" in str(no_index.value)
    with pytest.raises(RollupInvalidError, match="does not exist"):
        rollup(name="r.missing", into=f"{schema}.nope", **options)
    with pytest.raises(RollupInvalidError) as fields:
        rollup(
            name="r.bad",
            into="a.b.c",
            source_sql="SELECT 1",
            key=(),
            lookback="-1s",
            connect=object(),
            registry=registry,
        )
    problems = [p.split(":")[0] for p in fields.value.meta["problems"]]
    assert problems == ["into", "connect", "key", "source_sql", "lookback"]
    with pytest.raises(RollupInvalidError, match="tz"):
        Bucket("1d", "Bogota")
    # With a connection factory the check waits for the first pass, and refuses terminally there.
    deferred = rollup(
        name="r.deferred",
        into=f"{schema}.loose",
        **{**options, "connect": lambda: psycopg.AsyncConnection.connect(pg_url)},
    )
    assert not deferred.checked
    with use_driver(driver):
        queued = await deferred.enqueue({"at": datetime(2026, 3, 30, tzinfo=UTC)})
        await run_jobs(driver, registry=registry, timeout="30s")
    info = await driver.introspect.get(queued.id)
    assert info is not None and info.state == JobState.DEAD
    assert info.last_error_code == "X_JOB_ROLLUP_INVALID" and info.attempt == 1


# --- refresh_view --------------------------------------------------------------------------


async def test_refresh_view_checks_the_view_at_its_first_run(
    pg_url: str, rollup_tables: str, driver: PostgresDriver
) -> None:
    schema = rollup_tables
    _hourly_events(pg_url, schema, date(2026, 3, 29))
    _sql(
        pg_url,
        f"CREATE MATERIALIZED VIEW \"{schema}\".per_day AS SELECT date_trunc('day', at) "
        f'AS day, count(*) AS n FROM "{schema}".events_app GROUP BY 1',
    )
    registry = JobRegistry()
    plain = refresh_view(
        name="v.plain", view=f"{schema}.per_day", connect=pg_url, registry=registry
    )
    eager = refresh_view(
        name="v.concurrent",
        view=f"{schema}.per_day",
        connect=pg_url,
        concurrently=True,
        registry=registry,
    )
    ghost = refresh_view(name="v.ghost", view=f"{schema}.nope", connect=pg_url, registry=registry)
    with use_driver(driver):
        _hourly_events(pg_url, schema, date(2026, 3, 30))
        assert await plain.run_inline({}) == {"view": f"{schema}.per_day", "concurrently": False}
        assert _sql(pg_url, f'SELECT sum(n) FROM "{schema}".per_day') == [(47,)]
        with pytest.raises(RefreshViewInvalidError, match="no unique index") as refused:
            await eager.run_inline({})
        assert refused.value.code == "X_JOB_REFRESH_VIEW_INVALID"
        _sql(pg_url, f'CREATE UNIQUE INDEX ON "{schema}".per_day (day)')
        assert (await eager.run_inline({}))["concurrently"] is True
        queued = await ghost.enqueue({})
        await run_jobs(driver, registry=registry, timeout="30s")
    info = await driver.introspect.get(queued.id)
    assert info is not None and info.last_error_code == "X_JOB_REFRESH_VIEW_INVALID"
    assert "create it first" in (info.last_error or "")
    with pytest.raises(RefreshViewInvalidError) as fields:
        refresh_view(name="v.bad", view="", connect=3, concurrently="yes", registry=registry)  # type: ignore[arg-type]
    assert [p.split(":")[0] for p in fields.value.meta["problems"]] == [
        "view",
        "connect",
        "concurrently",
    ]


def test_the_pg_factories_are_installed_entry_points() -> None:
    from importlib.metadata import entry_points

    found = {ep.name: ep.value for ep in entry_points(group="jobs.factories")}
    assert found["rollup"] == "jobs_pg:rollup" and found["refresh_view"] == "jobs_pg:refresh_view"
