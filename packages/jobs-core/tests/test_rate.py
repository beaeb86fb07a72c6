"""Fleet rate limits in core: the declaration, the window arithmetic, the worker's checks.

The per-driver behaviour is the conformance area ``test_rate.py``.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from jobs_core import JobRegistry, Rate, job, use_driver
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import JobDeclarationInvalidError, RateUnenforceableError
from jobs_core.metrics import JobsMetrics
from jobs_core.rate import take_from_window
from jobs_core.testing import ManualClock, run_jobs
from jobs_core.worker import Worker


class Call(BaseModel):
    org: str
    n: int


def _declare(
    registry: JobRegistry, rate: Any, starts: list[datetime] | None = None, clock: Any = None
) -> Any:
    """Declare ``t.rated``; its body records ``clock.now()`` in ``starts`` when given."""

    @job(
        input=Call,
        idempotency_key=lambda c: f"{c.org}-{c.n}",
        tenant="none",
        name="t.rated",
        registry=registry,
        rate=rate,
    )
    async def rated(c: Call) -> None:
        if starts is not None:
            starts.append(clock.now())

    return rated


def test_a_bad_rate_names_every_problem(registry: JobRegistry) -> None:
    with pytest.raises(JobDeclarationInvalidError) as caught:
        _declare(registry, Rate(0, per="soon", when_limited="drop"))  # type: ignore[arg-type]
    problems = caught.value.meta["problems"]
    assert any(p.startswith("rate.limit:") for p in problems)
    assert any(p.startswith("rate.per:") for p in problems)
    assert any(p.startswith("rate.when_limited:") for p in problems)
    with pytest.raises(JobDeclarationInvalidError, match="rate: must be a Rate"):
        _declare(registry, 10)
    with pytest.raises(JobDeclarationInvalidError, match=r"rate.per: must be at most a day"):
        _declare(registry, Rate(1, per="2d"))
    with pytest.raises(JobDeclarationInvalidError, match=r"rate.margin"):
        _declare(registry, Rate(1, per="1s", margin=-5))


def test_the_window_carries_a_dispatch_margin() -> None:
    assert Rate(20, per="1s").window_ms == 1_050
    assert Rate(100, per="1s").window_ms == 1_010
    assert Rate(10, per="1m").window_ms == 60_050
    assert Rate(5, per="1s", margin=0).window_ms == 1_000
    assert Rate(5, per="1s", margin="200ms").window_ms == 1_200


def test_the_manifest_describes_the_rate(registry: JobRegistry) -> None:
    handle = _declare(registry, Rate(20, per="1s", key=lambda c: c.org, when_limited="fail"))
    assert handle.describe()["rate"] == {
        "limit": 20,
        "per_ms": 1_000,
        "window_ms": 1_050,
        "per_key": True,
        "when_limited": "fail",
    }
    assert Rate(3).bucket("j", None) == "rate:j"
    assert Rate(3, key=lambda c: c.org).bucket("j", Call(org="o1", n=1)) == "rate-key:j:o1"


@given(
    limit=st.integers(1, 5),
    per=st.integers(1, 50),
    steps=st.lists(st.integers(0, 30), min_size=1, max_size=60),
)
def test_grants_never_overfill_a_window_and_the_wait_is_exact(
    limit: int, per: int, steps: list[int]
) -> None:
    stamps: list[int] = []
    granted: list[int] = []
    now = 0
    for step in steps:
        now += step
        before = list(stamps)
        stamps, wait = take_from_window(stamps, limit, per, now)
        if wait == 0:
            granted.append(max(now, before[-1]) if before else now)
            continue
        assert stamps == before[-limit:], "a refusal records nothing"
        assert take_from_window(before, limit, per, now + wait)[1] == 0
        assert take_from_window(before, limit, per, now + wait - 1)[1] > 0
    for i, start in enumerate(granted):
        inside = [g for g in granted[i:] if g < start + per]
        assert len(inside) <= limit


async def test_a_worker_refuses_a_rate_its_driver_cannot_enforce(registry: JobRegistry) -> None:
    class NoRate(MemoryDriver):
        capabilities = MemoryDriver.capabilities - {"rate"}

    _declare(registry, Rate(1))
    driver = NoRate()
    worker = Worker(driver, registry=registry)
    with pytest.raises(RateUnenforceableError) as caught:
        await worker.run()
    assert caught.value.code == "X_JOB_RATE_UNENFORCEABLE"
    assert caught.value.meta["jobs"] == ["t.rated"]
    await driver.close()


async def test_limited_rows_wait_for_their_tokens_on_the_driver_clock(
    registry: JobRegistry,
) -> None:
    clock = ManualClock()
    driver = MemoryDriver(clock)
    starts: list[datetime] = []
    handle = _declare(registry, Rate(2, per="1s", margin=0), starts, clock)
    with use_driver(driver):
        await handle.enqueue_many([Call(org="o", n=n) for n in range(7)])
    stats = await run_jobs(driver, clock=clock, registry=registry, timeout="20s")
    assert stats.outcomes["completed"] == 7
    assert stats.outcomes["deferred"] >= 5
    offsets = sorted((s - starts[0]).total_seconds() for s in starts)
    assert offsets == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0]
    await driver.close()


async def test_limited_attempts_are_counted_by_mode(registry: JobRegistry) -> None:
    driver = MemoryDriver()
    metrics = JobsMetrics()
    handle = _declare(registry, Rate(1, per="1h"))
    with use_driver(driver):
        await handle.enqueue_many([Call(org="o", n=n) for n in range(2)])
    worker = Worker(driver, registry=registry, metrics=metrics, poll_interval="5ms")
    task = asyncio.get_running_loop().create_task(worker.run())
    for _ in range(400):
        if worker.stats().outcomes.get("deferred"):
            break
        await asyncio.sleep(0.01)
    await worker.stop()
    await task
    labels = {"queue": "default", "job": "t.rated", "mode": "wait"}
    assert metrics.registry.get_sample_value("job_rate_limited_total", labels) == 1
    assert worker.stats().outcomes == {"completed": 1, "deferred": 1}
    await driver.close()
