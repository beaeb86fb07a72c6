"""Issue 19's kill proof: a real worker process SIGKILLed mid-import (local source, PostgreSQL
driver and table); the next worker resumes at the last checkpointed byte offset, at most one
page's rows are handled twice, and the table ends with every row exactly once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import ie_kill_app
import psycopg
import pytest
from psycopg import sql

from jobs_core import JobState, use_driver
from jobs_pg import PostgresDriver

APPS = Path(__file__).parent / "apps"
ROWS = 20_000
STALL_AFTER = 35  # handle calls: the kill lands in the fourth page (about 10 batches a page)

pytestmark = pytest.mark.pg


class Workers:
    """``jobsctl worker`` subprocesses of the kill app; killed at the end whatever happened."""

    def __init__(self, url: str, folder: Path) -> None:
        self.url = url
        self.folder = folder
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, env: dict[str, str]) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "jobs_core", "worker", "ie_kill_app", "--driver", self.url]
        argv += ["--visibility-timeout", "2s", "--concurrency", "1", "--log-level", "warning"]
        log = (self.folder / f"worker{len(self.procs)}.log").open("wb")
        full_env = {**os.environ, "PYTHONPATH": str(APPS), **env}
        proc = subprocess.Popen(argv, env=full_env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture
def workers(pg_url: str, pg_schema: str, tmp_path: Path) -> Iterator[Workers]:
    started = Workers(f"{pg_url}?schema={pg_schema}", tmp_path)
    yield started
    started.stop()


async def _until(check: object, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        outcome = check() if callable(check) else check
        if asyncio.iscoroutine(outcome):
            outcome = await outcome
        if outcome:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout} s")
        await asyncio.sleep(0.05)


async def test_a_sigkill_mid_import_resumes_at_the_checkpoint_and_every_row_lands_once(
    pg_url: str, pg_schema: str, workers: Workers, tmp_path: Path
) -> None:
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "upload.csv").write_bytes(
        b"id,name\n" + b"".join(b"%d,row number %d\n" % (i, i) for i in range(ROWS))
    )
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(pg_schema)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.imported (id int PRIMARY KEY, name text NOT NULL, handled int)"
            ).format(sql.Identifier(pg_schema))
        )
    driver = await PostgresDriver.connect(pg_url, schema=pg_schema, min_size=1, max_size=2)
    try:
        await driver.migrate()
        with use_driver(driver):
            queued = await ie_kill_app.upload.enqueue(ie_kill_app.Upload(key="upload.csv"))
        env = {"IE_KILL_DIR": str(folder), "IE_KILL_DB": pg_url, "IE_KILL_SCHEMA": pg_schema}
        mark = tmp_path / "stalled"
        first = workers.start(
            {**env, "IE_KILL_STALL_AFTER": str(STALL_AFTER), "IE_KILL_MARK": str(mark)}
        )
        await _until(mark.exists, "the first worker reaching its stall")
        killed_at = await driver.introspect.get(queued.id)
        assert killed_at is not None and killed_at.state == JobState.RUNNING
        pages_done = [s for s in killed_at.steps if s.name.startswith("page:")]
        assert pages_done and all(s.status == "completed" for s in pages_done)
        checkpoint = pages_done[-1].output
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        assert first.returncode == -signal.SIGKILL

        workers.start(env)

        async def finished() -> bool:
            found = await driver.introspect.get(queued.id)
            assert found is not None
            return found.state == JobState.DONE

        await _until(finished, "the second worker finishing the import")
        done = await driver.introspect.get(queued.id)
        assert done is not None
        assert done.attempt == 2
        assert done.result["rows"] == ROWS and done.result["rejected"] == 0
        # The resumed attempt's first page started at the checkpoint the killed one left.
        resumed = next(s for s in done.steps if s.name == f"page:{len(pages_done)}")
        page_rows = resumed.output["rows"] - checkpoint["rows"]
    finally:
        await driver.close()

    with psycopg.connect(pg_url) as conn:
        table = sql.Identifier(pg_schema, "imported")
        count, distinct, low, high = conn.execute(
            sql.SQL("SELECT count(*), count(DISTINCT id), min(id), max(id) FROM {}").format(table)
        ).fetchone()
        twice = [
            row[0]
            for row in conn.execute(
                sql.SQL("SELECT id FROM {} WHERE handled > 1 ORDER BY id").format(table)
            )
        ]
        assert not conn.execute(
            sql.SQL("SELECT 1 FROM {} WHERE handled > 2").format(table)
        ).fetchone()
    assert (count, distinct, low, high) == (ROWS, ROWS, 0, ROWS - 1)  # every row exactly once
    print(f"\nkilled after page {len(pages_done) - 1}; {len(twice)} rows handled twice")
    assert 0 < len(twice) <= page_rows  # at most one page's worth
    # Exactly the rows of the page in flight, from the checkpointed offset on.
    assert twice == list(range(checkpoint["rows"], checkpoint["rows"] + len(twice)))
    stalled_first_row = int((tmp_path / "stalled").read_text())
    assert twice[-1] == stalled_first_row + ie_kill_app.BATCH - 1
