"""Real worker processes on the real server: many claimants, and SIGKILLs at step boundaries."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jobs_core import JobState
from jobs_core.ids import new_id
from jobs_core.types import EnqueueRequest
from jobs_redis import RedisDriver, open_client
from redis_helpers import eventually

APPS = Path(__file__).parent / "apps"

# Also run on a Redis Cluster by ``nox -s cluster-redis`` (``-m "conformance or processes"``).
pytestmark = pytest.mark.processes


def spawn(url: str, prefix: str, app: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jobs_core.cli",
            "worker",
            app,
            "--driver",
            f"{url}?prefix={prefix}",
            "--log-level",
            "error",
            *args,
        ],
        cwd=APPS,
        env={**os.environ, "JOBS_TEST_REDIS_URL": url, "JOBS_TEST_PREFIX": prefix, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def unit(n: int) -> EnqueueRequest:
    return EnqueueRequest(
        name="count.unit",
        queue="default",
        input={"n": n},
        idempotency_key=f"u{n}",
        tenant_id=None,
        max_attempts=3,
        id=new_id(),
        run_id=new_id(),
    )


async def test_four_worker_processes_run_ten_thousand_rows_exactly_once(
    driver: RedisDriver, redis_url: str, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    total = 10_000
    results = await driver.enqueue_many([unit(n) for n in range(total)])
    assert not any(r.deduped for r in results)
    started = time.perf_counter()
    procs = [spawn(redis_url, prefix, "redis_count_app", "--concurrency", "32") for _ in range(4)]
    try:

        async def finished() -> bool:
            [stats] = await driver.stats()
            assert all(p.poll() is None for p in procs), "a worker process died"
            return stats.done == total

        await eventually(finished, timeout=240)
        elapsed = time.perf_counter() - started
    finally:
        stop(procs)
    [stats] = await driver.stats()
    assert (stats.ready, stats.running, stats.done, stats.dead) == (0, 0, total, 0)
    client = open_client(redis_url, decode_responses=True)
    effects = await client.hgetall("{" + prefix + "}:effects")
    await client.aclose()
    assert len(effects) == total
    assert set(effects.values()) == {"1"}, "a row ran more than once"
    with capsys.disabled():
        print(
            f"\n4 worker processes x 32 slots: {total} rows done exactly once in "
            f"{elapsed:.1f} s ({total / elapsed:.0f} jobs/s, process start included)"
        )


# Every boundary of every step is killed by the conformance suite's crash-proof tests (through
# crash_worker_command); these check the three boundaries of a middle step against an exact
# effect log, and count the effects themselves.
KILL_POINTS = [("before", "ship"), ("returned", "ship"), ("persisted", "ship")]


@pytest.mark.parametrize(("point", "step"), KILL_POINTS)
async def test_sigkill_at_a_step_boundary_recovers_with_the_clean_effects(
    driver: RedisDriver, redis_url: str, prefix: str, tmp_path: Path, point: str, step: str
) -> None:
    effects = tmp_path / "effects.log"
    request = EnqueueRequest(
        name="crash.three",
        queue="default",
        input={"key": "o1"},
        idempotency_key="o1",
        tenant_id=None,
        max_attempts=4,
        id=new_id(),
        run_id=new_id(),
    )
    await driver.enqueue(request)
    env = {"JOBS_TEST_EFFECTS": str(effects), "JOBS_TEST_KILL": f"{point}:{step}"}
    first = spawn(redis_url, prefix, "redis_crash_app", "--visibility-timeout", "1s", **env)
    assert first.wait(60) == -signal.SIGKILL, "the worker was not killed at the boundary"
    second = spawn(redis_url, prefix, "redis_crash_app", "--visibility-timeout", "1s", **env)
    try:
        await eventually(lambda: _settled(driver, request.id), timeout=30)
    finally:
        stop([second])
    row = await driver.operator.get(request.id)
    assert row is not None
    assert (row.state, row.attempt, row.result) == (JobState.DONE, 2, "ok")
    lines = effects.read_text().split()
    # A step whose output was persisted before the kill never runs again; the killed step runs
    # again only if its output was not persisted (at least once); later steps run once.
    order = ["charge", "ship", "notify"]
    expected = list(order)
    if point == "returned":
        expected.insert(order.index(step) + 1, step)
    assert lines == expected


async def test_sigkill_inside_a_once_step_ends_outcome_unknown(
    driver: RedisDriver, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    request = EnqueueRequest(
        name="crash.once",
        queue="default",
        input={"key": "p1"},
        idempotency_key="p1",
        tenant_id=None,
        max_attempts=4,
        id=new_id(),
        run_id=new_id(),
    )
    await driver.enqueue(request)
    env = {"JOBS_TEST_EFFECTS": str(effects), "JOBS_TEST_KILL": "returned:pay"}
    first = spawn(redis_url, prefix, "redis_crash_app", "--visibility-timeout", "1s", **env)
    assert first.wait(60) == -signal.SIGKILL
    second = spawn(redis_url, prefix, "redis_crash_app", "--visibility-timeout", "1s", **env)
    try:
        await eventually(lambda: _settled(driver, request.id), timeout=30)
    finally:
        stop([second])
    row = await driver.operator.get(request.id)
    assert row is not None
    assert (row.state, row.last_error_code) == (JobState.DEAD, "X_STEP_OUTCOME_UNKNOWN")
    assert effects.read_text().split() == ["pay"]
    [pay] = row.steps
    assert (pay.name, pay.status, pay.once) == ("pay", "started", True)


async def _settled(driver: RedisDriver, job_id: Any) -> bool:
    row = await driver.operator.get(job_id)
    return row is not None and row.state in (JobState.DONE, JobState.DEAD, JobState.FAILED)
