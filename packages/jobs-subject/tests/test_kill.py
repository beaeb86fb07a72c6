"""SIGKILL mid-erase and mid-export with real ``jobsctl worker`` processes on PostgreSQL.

The worker app (``apps/subject_kill_app.py``) stops at a chosen step's ``returned`` boundary:
that page's write has committed (rows deleted, or a part put) and its output is not stored yet.
The test kills the process there, starts another worker, and checks that the next attempt
resumes at that very step and ends as an uninterrupted run of the same declaration ends: the
same rows in every table (digests), the same record, the same parts byte for byte; and that no
``index.json`` exists until the export's pass completes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import subject_kill_app as app

import subject_world as world
from jobs_core import JobRegistry, JobState, use_driver
from jobs_core.testing import run_jobs
from jobs_import_export import local_sink
from jobs_pg import PostgresDriver
from jobs_subject import subject_erase, subject_export

TESTS = Path(__file__).parent
ERASE_STALL = "erase:comments:comments_post_id_fkey:1"
EXPORT_STALL = "export:comments:comments_post_id_fkey:1"


class Workers:
    """``jobsctl worker`` subprocesses of the kill app; killed at the end whatever happened."""

    def __init__(self, url: str, folder: Path) -> None:
        self.url = url
        self.folder = folder
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, env: dict[str, str]) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "jobs_core", "worker", "subject_kill_app"]
        argv += ["--driver", self.url, "--visibility-timeout", "2s", "--concurrency", "1"]
        argv += ["--log-level", "warning"]
        log = (self.folder / f"worker{len(self.procs)}.log").open("wb")
        path = os.pathsep.join([str(TESTS), str(TESTS / "apps")])
        proc = subprocess.Popen(
            argv,
            env={**os.environ, "PYTHONPATH": path, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    def logs(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.folder.glob("worker*.log")))


@pytest.fixture
def workers(url: str, tmp_path: Path) -> Iterator[Workers]:
    started = Workers(url, tmp_path)
    yield started
    started.stop()


@pytest.fixture
def twin_schema(pg_url: str) -> Iterator[str]:
    """A second app schema, seeded like the first, for the uninterrupted run."""
    name = f"a_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
        world.create(conn, name)
        world.seed_statements(conn, name)
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def seeded(conn: psycopg.Connection[Any], app_schema: str) -> str:
    world.create(conn, app_schema)
    world.seed_statements(conn, app_schema)
    return app_schema


async def _until(check: Callable[[], Any], what: str, workers: Workers, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        outcome = check()
        if asyncio.iscoroutine(outcome):
            outcome = await outcome
        if outcome:
            return outcome
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout} s:\n{workers.logs()}")
        await asyncio.sleep(0.05)


async def _kill_at_mark(
    workers: Workers, env: dict[str, str], mark: Path, conn: psycopg.Connection[Any]
) -> Any:
    """Start a worker that stalls, SIGKILL it there; answer the database's time after."""
    first = workers.start({**env, "SUBJECT_STALL_MARK": str(mark)})
    await _until(mark.exists, "the first worker reaching its stall", workers)
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    assert first.returncode == -signal.SIGKILL
    return conn.execute("SELECT now()").fetchone()[0]


def _resumed_at(job: Any, stalled: str, killed_at: Any) -> None:
    """Every step before ``stalled`` completed before the kill (replayed), it and every later
    one after (run by the next attempt): the run resumed at its step."""
    names = [step.name for step in job.steps]
    at = names.index(stalled)
    assert all(step.completed_at < killed_at for step in job.steps[:at])
    assert all(step.completed_at > killed_at for step in job.steps[at:])


async def _finished(driver: PostgresDriver, job_id: Any, workers: Workers) -> Any:
    async def done() -> Any:
        found = await driver.introspect.get(job_id)
        assert found is not None
        assert found.state not in (JobState.DEAD, JobState.FAILED), found.last_error
        return found if found.state == JobState.DONE else None

    return await _until(done, "the second worker finishing the run", workers)


def _attempts(job: Any) -> dict[str, int]:
    return {step.name: step.output["attempt"] for step in job.steps if "attempt" in step.output}


async def test_a_sigkill_mid_erase_resumes_at_its_step_and_ends_as_an_uninterrupted_run(
    driver: PostgresDriver,
    registry: JobRegistry,
    workers: Workers,
    seeded: str,
    twin_schema: str,
    conn: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    # The uninterrupted run, in this process, on the twin schema.
    twin = world.declare(twin_schema, name=f"twin-{uuid.uuid4().hex[:8]}", batch=app.BATCH)
    baseline = subject_erase(
        name="subject.twin.erase", input=app.Person, tenant="none", subject=twin, registry=registry
    )
    queued = await baseline.enqueue(app.Person(user_id=1))
    await run_jobs(driver, registry=registry, timeout="60s")
    uninterrupted = await driver.introspect.get(queued.id)
    assert uninterrupted is not None and uninterrupted.state == JobState.DONE

    before = world.counts(conn, seeded)
    with use_driver(driver):
        killed = await app.erase_user.enqueue(app.Person(user_id=1))
    env = {"SUBJECT_APP_SCHEMA": seeded, "SUBJECT_STALL_STEP": ERASE_STALL}
    killed_at = await _kill_at_mark(workers, env, tmp_path / "stalled", conn)
    midway = world.counts(conn, seeded)
    assert midway["comments"] < before["comments"]  # the stalled page's delete committed
    assert midway["posts"] == before["posts"]  # and the passes after it never ran

    workers.start({"SUBJECT_APP_SCHEMA": seeded})
    done = await _finished(driver, killed.id, workers)
    assert done.attempt == 2
    _resumed_at(done, ERASE_STALL, killed_at)
    ran = _attempts(done)
    names = [step.name for step in done.steps if step.name in ran]
    stalled = names.index(ERASE_STALL)
    assert all(ran[n] == 1 for n in names[:stalled])  # replayed from storage
    assert all(ran[n] == 2 for n in names[stalled:])  # resumed at its step
    assert ran[ERASE_STALL] == 2
    # The same final state as the uninterrupted run, table by table, and the same record.
    assert world.digests(conn, seeded) == world.digests(conn, twin_schema)
    mine, theirs = dict(done.result), dict(uninterrupted.result)
    assert mine.pop("erased_at") and theirs.pop("erased_at")
    assert mine == {**theirs, "subject": "user"}


async def test_a_sigkill_mid_export_leaves_no_index_until_the_pass_completes(
    driver: PostgresDriver,
    registry: JobRegistry,
    workers: Workers,
    seeded: str,
    conn: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    exports = tmp_path / "exports"
    reference = tmp_path / "reference"
    twin = world.declare(seeded, name=f"twin-{uuid.uuid4().hex[:8]}", batch=app.BATCH)
    baseline = subject_export(
        name="subject.twin.export",
        input=app.Person,
        tenant="none",
        subject=twin,
        sink=lambda: local_sink(reference),
        prefix=lambda i: f"subjects/{i.user_id}",
        registry=registry,
    )
    await baseline.enqueue(app.Person(user_id=1))
    await run_jobs(driver, registry=registry, timeout="60s")

    with use_driver(driver):
        killed = await app.export_user.enqueue(app.Person(user_id=1))
    env = {"SUBJECT_APP_SCHEMA": seeded, "SUBJECT_APP_EXPORTS": str(exports)}
    stall = {**env, "SUBJECT_STALL_STEP": EXPORT_STALL}
    killed_at = await _kill_at_mark(workers, stall, tmp_path / "mark", conn)
    index = exports / "subjects/1/index.json"
    written = sorted(p.relative_to(exports) for p in exports.rglob("part-*"))
    assert written and not index.exists()

    workers.start(env)
    done = await _finished(driver, killed.id, workers)
    assert done.attempt == 2
    _resumed_at(done, EXPORT_STALL, killed_at)
    listed = json.loads(index.read_text())
    keys = [p["key"] for entry in listed["tables"] + listed["targets"] for p in entry["parts"]]
    on_disk = sorted(str(p.relative_to(exports)) for p in exports.rglob("part-*"))
    assert sorted(keys) == on_disk and len(on_disk) > len(written)
    last_part = max((exports / key).stat().st_mtime_ns for key in keys)
    assert index.stat().st_mtime_ns >= last_part  # written after the last part
    for key in keys:  # byte for byte what the uninterrupted export wrote
        assert (exports / key).read_bytes() == (reference / key).read_bytes()
    expected = json.loads((reference / "subjects/1/index.json").read_text())
    for body in (listed, expected):
        body.pop("exported_at")
        body.pop("subject")
    assert listed == expected
