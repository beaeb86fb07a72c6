"""The outbox under relay crashes: two ``jobsctl relay`` processes, one SIGKILLed on a cadence and
restarted, publish every staged row exactly once and in order.

In the field a relay restarted after a SIGKILL skipped the rows still leased to the dead relay
and published later rows first (50 rows arrived after later ones). Here:

* exclusive relays (the default, one holds the relay lease; the holder is the one killed): every
  row is published once, in global staging order;
* side-by-side relays (``--side-by-side``) with an ``order_key`` per row: every row once, in
  staging order per key.

The order rows were published in is read from the database itself: a trigger on the test's own
``jobs`` table numbers every inserted row (a re-publish inserts nothing, so it is not numbered).
The CI-sized runs (1,500 rows, a kill after every 150 published) are in the default suite; the
10,000-row run with a kill every 2 s is marked ``slow`` (``nox -s outbox-soak``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
from pydantic import BaseModel

from jobs_core import JobRegistry, job, use_driver
from jobs_core.outbox import use_outbox
from jobs_pg import PostgresDriver, transaction

LANES = 8
"""Order keys the side-by-side runs spread their rows over."""


class Row(BaseModel):
    n: int


REGISTRY = JobRegistry()


@job(
    input=Row,
    idempotency_key=lambda r: f"soak:{r.n}",
    tenant="none",
    name="soak.row",
    registry=REGISTRY,
)
async def soak_row(input: Row, step: Any, ctx: Any) -> None:
    """Never run: the soak only publishes."""


@dataclass
class Relays:
    """``jobsctl relay`` subprocesses over one schema; kills and restarts them."""

    url: str
    logs: Path
    side_by_side: bool
    batch: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    kills: int = 0

    def start(self, slot: int) -> None:
        argv = [sys.executable, "-m", "jobs_core.cli", "relay", "--driver", self.url]
        argv += ["--batch", str(self.batch), "--claim-lease", "1s", "--poll-interval", "50ms"]
        argv += ["--log-level", "warning"]
        if self.side_by_side:
            argv.append("--side-by-side")
        out = (self.logs / f"relay{slot}-{self.kills}.out").open("wb")
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        if slot < len(self.procs):
            self.procs[slot] = proc
        else:
            self.procs.append(proc)

    def kill(self, slot: int) -> None:
        """SIGKILL one relay (mid-pass, wherever it is) and start a fresh one in its place."""
        proc = self.procs[slot]
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            self.kills += 1
        self.start(slot)

    def slot_of(self, holder: str | None) -> int | None:
        """Answer which relay a relay id (``host:pid:random``) belongs to."""
        for slot, proc in enumerate(self.procs):
            if holder is not None and f":{proc.pid}:" in holder:
                return slot
        return None

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


async def _observe(conn: psycopg.AsyncConnection[Any], schema: str) -> None:
    """Number every row inserted into the test schema's jobs table, in insertion order."""
    await conn.execute(
        f'CREATE TABLE "{schema}".published (seq bigserial PRIMARY KEY, job_id uuid NOT NULL)'
    )
    await conn.execute(
        f'CREATE FUNCTION "{schema}".note_published() RETURNS trigger LANGUAGE plpgsql AS $$ '
        f'BEGIN INSERT INTO "{schema}".published (job_id) VALUES (NEW.id); RETURN NEW; END $$'
    )
    await conn.execute(
        f'CREATE TRIGGER note_published AFTER INSERT ON "{schema}".jobs '
        f'FOR EACH ROW EXECUTE FUNCTION "{schema}".note_published()'
    )


async def _stage(
    driver: PostgresDriver, conn: psycopg.AsyncConnection[Any], rows: int, side_by_side: bool
) -> list[tuple[UUID, str | None]]:
    """Stage ``rows`` rows in transactions of 500: answer ``(job id, lane)`` in staging order."""
    staged: list[tuple[UUID, str | None]] = []
    with use_outbox(driver.outbox, driver, mode="required"), use_driver(driver):
        for start in range(0, rows, 500):
            numbers = range(start, min(rows, start + 500))
            async with transaction(conn):
                if side_by_side:
                    for n in numbers:
                        lane = f"k{n % LANES}"
                        result = await soak_row.enqueue(Row(n=n), order_key=lane)
                        staged.append((result.id, lane))
                else:
                    results = await soak_row.enqueue_many([Row(n=n) for n in numbers])
                    staged += [(result.id, None) for result in results]
    return staged


async def _count(conn: psycopg.AsyncConnection[Any], query: str) -> int:
    cur = await conn.execute(query)
    found = await cur.fetchone()
    return int(found[0]) if found else 0


async def _soak(
    pg_url: str,
    schema: str,
    tmp_path: Path,
    *,
    rows: int,
    kill_every_s: float,
    kill_after_rows: int,
    side_by_side: bool,
    batch: int,
    timeout_s: float,
) -> tuple[int, float]:
    """Run one soak; answer (kills, seconds). Fails on a lost, doubled or misordered row.

    A relay is killed every ``kill_every_s`` once at least ``kill_after_rows`` rows were
    published since the last kill: the kills land mid-run however slow the machine is (a relay
    takes a second or more to start on a loaded one, and one killed before its first pass
    proves nothing).
    """
    driver = await PostgresDriver.connect(pg_url, schema=schema, min_size=1, max_size=2)
    relays = Relays(f"{pg_url}?schema={schema}", tmp_path, side_by_side, batch)
    unpublished = f'SELECT count(*) FROM "{schema}".outbox WHERE published_at IS NULL'
    published_rows = f'SELECT count(*) FROM "{schema}".published'
    try:
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            await _observe(conn, schema)
            staged = await _stage(driver, conn, rows, side_by_side)
            started = time.monotonic()
            for slot in range(2):
                relays.start(slot)
            turn, since, last_kill = 0, 0, time.monotonic()
            while await _count(conn, unpublished):
                assert time.monotonic() - started < timeout_s, "rows never published"
                await asyncio.sleep(0.05)
                done = await _count(conn, published_rows)
                if done - since < kill_after_rows or time.monotonic() - last_kill < kill_every_s:
                    continue
                if side_by_side:
                    relays.kill(turn % 2)
                else:
                    # Kill the relay that holds the lease: the one publishing.
                    cur = await conn.execute(
                        f'SELECT holder FROM "{schema}".scheduler_leader '
                        "WHERE name = 'outbox-relay' AND expires_at > now()"
                    )
                    found = await cur.fetchone()
                    victim = relays.slot_of(found[0] if found else None)
                    if victim is None:
                        continue
                    relays.kill(victim)
                turn, since, last_kill = turn + 1, done, time.monotonic()
            elapsed = time.monotonic() - started
            cur = await conn.execute(f'SELECT job_id FROM "{schema}".published ORDER BY seq')
            published = [row[0] for row in await cur.fetchall()]
            jobs = await _count(conn, f'SELECT count(*) FROM "{schema}".jobs')
    finally:
        relays.stop()
        await driver.close()
    ids = [job_id for job_id, _ in staged]
    assert jobs == rows, f"{jobs} jobs for {rows} staged rows"
    assert sorted(published) == sorted(ids), "every staged row published exactly once"
    if side_by_side:
        position = {job_id: i for i, job_id in enumerate(published)}
        for lane in {lane for _, lane in staged}:
            in_lane = [job_id for job_id, key in staged if key == lane]
            assert sorted(in_lane, key=position.__getitem__) == in_lane, f"{lane} out of order"
    else:
        late = [i for i, (got, want) in enumerate(zip(published, ids, strict=True)) if got != want]
        assert late == [], f"{len(late)} rows out of staging order, first at {late[:1]}"
    return relays.kills, elapsed


@pytest.mark.timeout(300)
@pytest.mark.parametrize("side_by_side", [False, True], ids=["exclusive", "side-by-side"])
async def test_relays_killed_mid_run_publish_each_row_once_in_order(
    pg_url: str, migrated: str, tmp_path: Path, side_by_side: bool
) -> None:
    """CI-sized: 1,500 rows, batches of 10, a relay SIGKILLed after every 150 rows published."""
    kills, _ = await _soak(
        pg_url,
        migrated,
        tmp_path,
        rows=1_500,
        kill_every_s=0.2,
        kill_after_rows=150,
        side_by_side=side_by_side,
        batch=10,
        timeout_s=240,
    )
    assert kills >= 3, "the relays were killed mid-run"


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.timeout(900)
@pytest.mark.parametrize("side_by_side", [False, True], ids=["exclusive", "side-by-side"])
async def test_ten_thousand_rows_with_a_relay_killed_every_two_seconds(
    pg_url: str, migrated: str, tmp_path: Path, side_by_side: bool
) -> None:
    """The issue's figure: 10,000 rows, two relays, one SIGKILLed every 2 s and restarted."""
    kills, elapsed = await _soak(
        pg_url,
        migrated,
        tmp_path,
        rows=10_000,
        kill_every_s=2.0,
        kill_after_rows=1,
        side_by_side=side_by_side,
        batch=10,
        timeout_s=600,
    )
    print(f"10,000 rows, {kills} kills, {elapsed:.1f} s")
    assert kills >= 3
