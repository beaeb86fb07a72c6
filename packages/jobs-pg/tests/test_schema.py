"""The shipped SQL: migrations apply once under concurrency, the schema is the declared one,
every statement block is used and plans against it, and the ``jobsctl pg`` commands work."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql as pg_sql
from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

from jobs_core.errors import DriverRequestInvalidError
from jobs_pg import PostgresDriver
from jobs_pg._sql import FRAGMENTS, Statements, blocks, migrations
from pg_helpers import claim, request

PACKAGE = Path(__file__).parents[1] / "src" / "jobs_pg"

# The data model, as the driver's statements need it: per table, "column type" with "!" for
# NOT NULL, in column order. A migration that drifts from it fails here.
DECLARED_TABLES = {
    "backfills": (
        "id uuid!, name text!, checksum text!, status text!, app_version text, rows int8!,"
        "last_cursor jsonb, started_at timestamptz!, completed_at timestamptz, scope text!"
    ),
    "consumer_cursors": ("consumer text!, key text!, cursor jsonb!, updated_at timestamptz!"),
    "counters": (
        "name text!, tier text!, bucket timestamptz!, shard int2!, done int8!, retried int8!,"
        "failed int8!, dead int8!, duration_ms float8!"
    ),
    "events": (
        "id uuid!, seq int8!, name text!, payload jsonb!, correlation_key text,"
        "published_at timestamptz!, expires_at timestamptz!"
    ),
    "job_steps": (
        "run_id uuid!, name text!, seq int4!, status text!, output jsonb,"
        "started_at timestamptz, completed_at timestamptz, wake_at timestamptz, event text,"
        "match jsonb, attempts int4!, error text, once bool!"
    ),
    "jobs": (
        "id uuid!, seq int8!, name text!, queue text!, input jsonb!, idempotency_key text!,"
        "tenant_id text, run_id uuid!, state text!, attempts int4!, max_attempts int4!,"
        "run_at timestamptz!, visible_at timestamptz, claimed_by text, claim int4!,"
        "wake_pending bool!, last_error text, last_error_code text, last_error_stack text,"
        "result jsonb, progress jsonb, traceparent text, enqueued_by text, created_at timestamptz!,"
        "updated_at timestamptz!, priority int2!, debounced bool!, parent_run_id uuid"
    ),
    "leases": (
        "lease_key text!, slot int4!, holder text!, expires_at timestamptz!,"
        "acquired_at timestamptz!"
    ),
    "migrations": ("version int4!, name text!, checksum text!, applied_at timestamptz!"),
    "outbox": (
        "id uuid!, name text!, queue text!, input jsonb!, idempotency_key text!,"
        "tenant_id text, max_attempts int4!, run_id uuid!, run_at timestamptz!,"
        "traceparent text, enqueued_by text, staged_at timestamptz!, claimed_at timestamptz,"
        "claimed_by text, claim_expires_at timestamptz, published_at timestamptz,"
        "order_key text, priority int2!"
    ),
    "paused_queues": ("queue text!, paused_at timestamptz!"),
    "paused_tasks": ("task text!, paused_at timestamptz!"),
    "queues": ("name text!, created_at timestamptz!"),
    "rate_buckets": ("bucket_key text!, stamps _int8!, touched_ms int8!, wait_ms int8!"),
    "scheduler_leader": ("name text!, holder text!, expires_at timestamptz!"),
    "scheduler_state": ("task text!, watermark timestamptz!, updated_at timestamptz!"),
    "task_fires": (
        "task text!, occurrence timestamptz!, watermark timestamptz!, fired_at timestamptz!,"
        "job_ids _uuid!, cron text, tz text"
    ),
    "wake_slots": ("queue text!, slot int8!, armed bool!"),
    "workers": (
        "id text!, host text!, build text!, started_at timestamptz!, queues _text!,"
        "slots int4!, in_flight _uuid!, last_heartbeat timestamptz!, draining_at timestamptz,"
        "expires_at timestamptz!"
    ),
}

DECLARED_INDEXES = {
    "jobs_live_key": "UNIQUE (name, COALESCE(tenant_id, ''::text), idempotency_key) WHERE "
    "((state = ANY (ARRAY['ready'::text, 'delayed'::text, 'running'::text, 'suspended'::text])) "
    "AND (NOT (debounced AND (claim > 0))))",
    "jobs_claim": "(queue, priority, run_at, seq) WHERE "
    "(state = ANY (ARRAY['ready'::text, 'delayed'::text, 'suspended'::text]))",
    "jobs_lapse": "(visible_at) WHERE (state = 'running'::text)",
    "jobs_listing": "(created_at, id)",
    "jobs_tenant_listing": "(tenant_id, created_at, id) WHERE (tenant_id IS NOT NULL)",
    "jobs_dead_listing": "(queue, created_at, id) WHERE (state = 'dead'::text)",
    "jobs_run": "UNIQUE (run_id)",
    "jobs_parent_run": "(parent_run_id, created_at, id) WHERE (parent_run_id IS NOT NULL)",
    "job_steps_waiting": "(event) WHERE (status = 'waiting'::text)",
    "events_find": "(name, published_at, seq)",
    "events_expiry": "(expires_at)",
    "outbox_unpublished": "(staged_at, id) WHERE (published_at IS NULL)",
    "outbox_held": "(claim_expires_at) WHERE ((published_at IS NULL) AND "
    "(claim_expires_at IS NOT NULL))",
    "backfills_pass": "(name, scope, started_at)",
}


def _columns(spec: str) -> list[str]:
    return [part.strip() for part in spec.split(",")]


async def test_the_migrated_schema_is_the_declared_one(pg_url: str, migrated: str) -> None:
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        cur = await conn.execute(
            "SELECT table_name, column_name, udt_name, is_nullable FROM information_schema.columns"
            " WHERE table_schema = %s ORDER BY table_name, ordinal_position",
            (migrated,),
        )
        found: dict[str, list[str]] = {}
        for table, column, kind, nullable in await cur.fetchall():
            found.setdefault(table, []).append(f"{column} {kind}{'' if nullable == 'YES' else '!'}")
        cur = await conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s", (migrated,)
        )
        indexes = dict(await cur.fetchall())
        cur = await conn.execute(
            "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = %s",
            (migrated,),
        )
        functions = [row[0] for row in await cur.fetchall()]
    assert found == {table: _columns(spec) for table, spec in DECLARED_TABLES.items()}
    for name, shape in DECLARED_INDEXES.items():
        unique = shape.startswith("UNIQUE ")
        definition = indexes[name]
        assert definition.startswith("CREATE UNIQUE INDEX" if unique else "CREATE INDEX"), name
        assert definition.endswith(shape.removeprefix("UNIQUE ")), (name, definition)
    primary = {name for name in indexes if name.endswith("_pkey")}
    assert set(indexes) == set(DECLARED_INDEXES) | primary
    assert primary == {f"{table}_pkey" for table in DECLARED_TABLES}
    assert sorted(functions) == [
        "claim_waiting",
        "first_waiting",
        "run_id_taken",
        "wake",
        "wake_arm",
    ]


async def test_autovacuum_visits_the_jobs_and_steps_tables_early(
    pg_url: str, migrated: str
) -> None:
    """Claims step over the index entries of rows settled since the last vacuum (0003); steps
    churn with every durable run and every purge, and a pass runs at a queue's budget (0008)."""
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        cur = await conn.execute(
            "SELECT c.relname, c.reloptions FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname IN ('jobs', 'job_steps')",
            (migrated,),
        )
        options = {name: sorted(opts) for name, opts in await cur.fetchall()}
    queue = [
        "autovacuum_analyze_scale_factor=0.02",
        "autovacuum_vacuum_cost_delay=1",
        "autovacuum_vacuum_cost_limit=2000",
        "autovacuum_vacuum_insert_scale_factor=0.02",
        "autovacuum_vacuum_scale_factor=0.02",
        "autovacuum_vacuum_threshold=1000",
    ]
    assert options == {"jobs": queue, "job_steps": queue}


async def test_concurrent_migrates_all_succeed_and_apply_each_file_once(
    pg_url: str, schema: str
) -> None:
    drivers = [PostgresDriver(pg_url, schema=schema, min_size=0, max_size=1) for _ in range(4)]
    try:
        applied = await asyncio.gather(*(d.migrate() for d in drivers))
    finally:
        for driver in drivers:
            await driver.close()
    names = [m.name for m in migrations()]
    assert sorted(applied, key=len) == [[], [], [], names]
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        cur = await conn.execute(f'SELECT name FROM "{schema}".migrations ORDER BY version')
        assert [row[0] for row in await cur.fetchall()] == names


async def test_an_applied_migration_that_was_edited_is_refused(pg_url: str, migrated: str) -> None:
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute(f'UPDATE "{migrated}".migrations SET checksum = %s', ("edited",))
    driver = PostgresDriver(pg_url, schema=migrated, min_size=0, max_size=1)
    try:
        with pytest.raises(DriverRequestInvalidError, match="edited after it was applied"):
            await driver.migrate()
    finally:
        await driver.close()


def test_every_block_is_used() -> None:
    source = "\n".join(path.read_text() for path in PACKAGE.rglob("*.py"))
    statements = Statements("jobs").names()
    unused = sorted(name for name in statements if f'"{name}"' not in source)
    assert unused == []
    for fragment in FRAGMENTS:
        assert any("{" + fragment.removeprefix("job_") + "}" in body for body in blocks().values())


def test_every_statement_fits_psycopgs_placeholder_cache() -> None:
    """psycopg converts the ``%(name)s`` placeholders of a statement over 4,096 bytes at every
    call (~45 µs for the enqueue and the claim, whose comments made them longer)."""
    statements = Statements("s" * 48)  # the longest schema name there can be
    too_long = {
        name: len(statements[name])
        for name in statements.names()
        if len(statements[name]) > MAX_CACHED_STATEMENT_LENGTH
    }
    assert too_long == {}


async def test_every_statement_plans_against_the_migrated_schema(
    pg_url: str, migrated: str
) -> None:
    """PREPARE each block, then EXPLAIN EXECUTE it with NULL parameters: parsed, typed, planned
    against the real tables, and never run."""
    statements = Statements(migrated)
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        for name in sorted(statements.names()):
            text = statements[name].decode()
            order: list[str] = []

            def number(found: re.Match[str], order: list[str] = order) -> str:
                if found[1] not in order:
                    order.append(found[1])
                return f"${order.index(found[1]) + 1}"

            numbered = re.sub(r"%\((\w+)\)[sb]", number, text)
            await conn.execute(f"PREPARE probe AS {numbered}")  # type: ignore[arg-type]
            nulls = ", ".join(["NULL"] * len(order))
            await conn.execute(f"EXPLAIN EXECUTE probe{f'({nulls})' if order else ''}")  # type: ignore[arg-type]
            await conn.execute("DEALLOCATE probe")


QUICK_COMMITS: dict[str, dict[str, Any]] = {
    "claim": {
        "queues": ["quick"],
        "limit": 1,
        "lease_ms": 1_000,
        "worker": "w",
        "drop": [],
        "reason": "",
        "now": None,
    },
    "rate_take": {"key": "rate:quick", "limit": 1, "per_ms": 1_000, "now_ms": None, "now": None},
}
"""The blocks whose transaction commits without waiting for its WAL flush, with parameters."""


@pytest.mark.parametrize("name", sorted(QUICK_COMMITS))
async def test_the_claim_and_the_rate_take_commit_without_waiting_for_a_flush(
    pg_url: str, migrated: str, name: str
) -> None:
    """Each turns ``synchronous_commit`` off for its own transaction, and only for it.

    A planner that dropped the ``set_config`` (it once did for the rate take, whose takers then
    waited 80-180 ms for a flush each on a busy server) would leave the setting on.
    """
    statement = Statements(migrated)[name]
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        await conn.execute(statement, QUICK_COMMITS[name])
        cur = await conn.execute("SHOW synchronous_commit")
        assert await cur.fetchone() == ("off",)
        await conn.rollback()
        cur = await conn.execute("SHOW synchronous_commit")
        assert await cur.fetchone() == ("on",), "the setting outlived the transaction"


async def _buffers(conn: psycopg.AsyncConnection[Any], query: str) -> int:
    """Answer the shared buffers ``EXPLAIN (ANALYZE, BUFFERS)`` of ``query`` reports on top."""
    cur = await conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {query}")
    plan = "\n".join(row[0] for row in await cur.fetchall())
    found = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?", plan)
    assert found is not None, plan
    return int(found[1]) + int(found[2] or 0)


async def test_the_claim_walk_starts_where_its_probe_found_the_first_live_row(
    pg_url: str, migrated: str
) -> None:
    """Migration 0015: past the index entries of rows claimed since the last vacuum, once.

    10,000 rows were claimed and settled, autovacuum off for the table (their old versions stay
    in ``jobs_claim``, as between two vacuums). The probe for the queue's lowest priority steps
    over those entries; the walk of that priority's due rows used to do so again from the start
    of the range (before 0015 a claim of 10 read about twice the probe's buffers). It now starts
    at the probe's row, and the rows come in ``(run_at, seq)`` order right after the claimed ones.
    """
    s = pg_sql.Identifier(migrated).as_string(None)
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute(f"ALTER TABLE {s}.jobs SET (autovacuum_enabled = false)")
        await conn.execute(
            f"INSERT INTO {s}.jobs (id, run_id, name, queue, input, idempotency_key, state,"
            " max_attempts, run_at, created_at, updated_at)"
            " SELECT gen_random_uuid(), gen_random_uuid(), 'n', 'walk', '{}', 'k' || i, 'ready',"
            " 3, now() - interval '1 hour' + i * interval '1 ms', now(), now()"
            " FROM generate_series(1, 12000) AS i"
        )
        for _ in range(20):
            await conn.execute(
                f"UPDATE {s}.jobs SET state = 'done' WHERE id IN"
                f" (SELECT job_id FROM {s}.claim_waiting('walk', now(), 500))"
            )
        probe = (
            f"SELECT priority FROM {s}.jobs WHERE queue = 'walk'"
            " AND state IN ('ready', 'delayed', 'suspended')"
            " ORDER BY priority, run_at, seq LIMIT 1"
        )
        for _ in range(2):  # the first passes mark the dead entries (LP_DEAD), as claims do
            probe_buffers = await _buffers(conn, probe)
            claim_buffers = await _buffers(
                conn, f"SELECT * FROM {s}.claim_waiting('walk', now(), 10)"
            )
        cur = await conn.execute(
            f"SELECT j.idempotency_key FROM {s}.claim_waiting('walk', now(), 10) AS c"
            f" JOIN {s}.jobs j ON j.id = c.job_id ORDER BY c.job_run_at, c.job_seq"
        )
        keys = [row[0] for row in await cur.fetchall()]
    assert keys == [f"k{i}" for i in range(10_001, 10_011)]
    assert probe_buffers > 40, "the claimed rows' entries should be there to step over"
    assert claim_buffers < probe_buffers * 1.5, (probe_buffers, claim_buffers)


def _jobs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobs_core.cli", "pg", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_jobs_pg_migrate_and_sql(pg_url: str, schema: str) -> None:
    first = _jobs("migrate", "--driver", pg_url, "--schema", schema)
    applied = "".join(f"applied {m.name}\n" for m in migrations())
    assert (first.returncode, first.stdout) == (0, applied), first.stderr
    again = _jobs("migrate", "--driver", pg_url, "--schema", schema)
    assert again.stdout == f"schema '{schema}' is up to date\n"
    printed = _jobs("sql", "--schema", "review")
    assert printed.returncode == 0
    assert 'CREATE TABLE "review".jobs' in printed.stdout
    assert "{schema}" not in printed.stdout
    refused = _jobs("migrate", "--driver", "postgresql://postgres@127.0.0.1:1/x?connect_timeout=1")
    assert refused.returncode == 2 and "X_DRIVER_UNAVAILABLE" in refused.stderr


def test_jobs_pg_migrate_takes_the_schema_from_the_url(url: str, schema: str) -> None:
    """``?schema=`` in ``--driver`` names the schema, as it does for ``jobsctl worker`` (the
    command once migrated ``jobs`` whatever the URL said)."""
    first = _jobs("migrate", "--driver", url)
    applied = "".join(f"applied {m.name}\n" for m in migrations())
    assert (first.returncode, first.stdout) == (0, applied), first.stderr
    again = _jobs("migrate", "--driver", url)
    assert again.stdout == f"schema '{schema}' is up to date\n"


async def test_the_keda_query_answers_the_largest_demand(
    driver: PostgresDriver, pg_url: str
) -> None:
    await driver.enqueue_many([request(f"a{i}", queue="a") for i in range(5)])
    await driver.enqueue_many([request(f"b{i}", queue="b") for i in range(3)])
    await claim(driver, "b", limit=1)
    printed = _jobs("demand-sql", "--schema", driver.schema)
    only_b = _jobs("demand-sql", "--schema", driver.schema, "--queues", "b,it's")
    answers: list[Any] = []
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        for output in (printed, only_b):
            assert output.returncode == 0, output.stderr
            cur = await conn.execute(output.stdout)  # type: ignore[arg-type]
            answers.append((await cur.fetchone() or [None])[0])
    assert await driver.demand() == {"a": 5, "b": 3}
    assert answers == [5, 3]


def test_the_demo_runs_on_postgres(url: str) -> None:
    """``jobsctl demo --driver postgresql://…`` migrates the schema itself and tells the story."""
    demo = subprocess.run(
        [sys.executable, "-m", "jobs_core.cli", "demo", "--driver", url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "checks held" in demo.stdout


ONLINE = next(m for m in migrations() if m.name == "0013_listing_indexes.sql")


async def _forget_online(pg_url: str, schema: str) -> None:
    """Take ``schema`` back to before 0013: its indexes dropped, its record deleted."""
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute(f'DROP INDEX "{schema}".jobs_tenant_listing')
        await conn.execute(f'DROP INDEX "{schema}".jobs_dead_listing')
        await conn.execute(f'DELETE FROM "{schema}".migrations WHERE version = %s', (13,))


def test_the_listing_indexes_are_an_online_migration() -> None:
    assert ONLINE.online
    assert [m.name for m in migrations() if m.online] == [ONLINE.name]
    statements = ONLINE.statements("jobs")
    assert len(statements) == 2
    assert all(s.startswith(b"CREATE INDEX CONCURRENTLY IF NOT EXISTS") for s in statements)


async def test_enqueues_go_on_while_an_online_migration_waits_to_build(
    pg_url: str, migrated: str, driver_factory: Any
) -> None:
    """CREATE INDEX CONCURRENTLY waits for an open writer, but blocks no new one.

    A plain CREATE INDEX would queue its SHARE lock behind the open writer's, and every enqueue
    after it would queue behind that: the second enqueue below would hang until the commit.
    """
    await _forget_online(pg_url, migrated)
    writer = await psycopg.AsyncConnection.connect(pg_url)
    migrating: PostgresDriver = await driver_factory()
    enqueuer: PostgresDriver = await driver_factory()
    try:
        await writer.execute(
            f'INSERT INTO "{migrated}".jobs (id, run_id, name, queue, input, idempotency_key,'
            " state, max_attempts, run_at, created_at, updated_at)"
            " VALUES (gen_random_uuid(), gen_random_uuid(), 'open', 'default', 'null', 'open',"
            " 'ready', 1, now(), now(), now())"
        )
        migration = asyncio.create_task(migrating.migrate())
        await asyncio.sleep(1.0)
        assert not migration.done(), "the build did not wait for the open writer"
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(enqueuer.enqueue(request("during", tenant="t1")), 5)
        assert asyncio.get_running_loop().time() - started < 5
        assert not migration.done()
        await writer.commit()
        assert await asyncio.wait_for(migration, 30) == [ONLINE.name]
    finally:
        await writer.close()
        await migrating.close()
        await enqueuer.close()
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        cur = await conn.execute(
            "SELECT i.relname, x.indisvalid FROM pg_index x"
            " JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_namespace n"
            " ON n.oid = i.relnamespace WHERE n.nspname = %s AND i.relname LIKE 'jobs_%%listing'",
            (migrated,),
        )
        assert dict(await cur.fetchall()) == {
            "jobs_listing": True,
            "jobs_tenant_listing": True,
            "jobs_dead_listing": True,
        }


async def test_an_interrupted_online_build_is_dropped_and_built_again(
    pg_url: str, migrated: str, driver_factory: Any
) -> None:
    """A failed CREATE INDEX CONCURRENTLY leaves an INVALID index of the name; the next migrate
    must not take IF NOT EXISTS at its word."""
    await _forget_online(pg_url, migrated)
    driver: PostgresDriver = await driver_factory()
    for key in ("a", "b"):
        await driver.enqueue(request(key, tenant="same"))
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.UniqueViolation):
            await conn.execute(
                f'CREATE UNIQUE INDEX CONCURRENTLY jobs_tenant_listing ON "{migrated}".jobs'
                " (tenant_id)"
            )
        cur = await conn.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = %s::regclass",
            (f'"{migrated}".jobs_tenant_listing',),
        )
        assert await cur.fetchone() == (False,)

    try:
        assert await driver.migrate() == [ONLINE.name]
    finally:
        await driver.close()

    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        cur = await conn.execute(
            "SELECT x.indisvalid, pg_get_indexdef(x.indexrelid) FROM pg_index x"
            " WHERE x.indexrelid = %s::regclass",
            (f'"{migrated}".jobs_tenant_listing',),
        )
        valid, definition = await cur.fetchone() or (None, "")
    assert valid is True
    assert definition.endswith("(tenant_id, created_at, id) WHERE (tenant_id IS NOT NULL)")
