"""Fleet rate limits (where ``rate`` is declared): the bucket's arithmetic, and limited attempts.

A limited attempt is handed back due when the next token is free, or failed under the retry
policy.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from jobs_conformance.target import Target, claim
from jobs_core import JobRegistry, Rate, Retry, job, use_driver
from jobs_core.clock import SYSTEM_CLOCK
from jobs_core.driver import RateRequest, RateStore
from jobs_core.errors import JobsError
from jobs_core.execute import Attempt, AttemptEnv, execute
from jobs_core.types import ClaimedJob, JobInfo


class Call(BaseModel):
    """A rate-limited test job's input."""

    org: str
    n: int


def _rate(target: Target) -> RateStore:
    store: RateStore = target.require("rate")
    return store


async def test_the_window_admits_limit_grants_and_names_the_next_free_instant(
    target: Target,
) -> None:
    """With explicit instants: ``limit`` grants per ``(now - per, now]``.

    The wait is the oldest counted grant plus ``per`` minus now; refusals record nothing; keys
    are separate buckets.
    """
    rate = _rate(target)

    async def take(now: int, key: str = "rate:conformance.a") -> int:
        return await rate.take_token(RateRequest(key, 3, 1_000, now_ms=now))

    base = 1_700_000_000_000
    assert [await take(base + t) for t in (0, 0, 400)] == [0, 0, 0]
    assert await take(base + 10, key="rate:conformance.b") == 0, "another bucket"
    assert await take(base + 500) == 500
    assert await take(base + 999) == 1, "a refusal records nothing"
    assert await take(base + 1_000) == 0, "the two grants at +0 left the window at +1000"
    assert await take(base + 1_000) == 0
    assert await take(base + 1_001) == 399, "+400, +1000, +1000 are counted"
    # A request from before the newest grant counts as arriving at that grant (+1000).
    assert await take(base + 100) == 400
    assert await take(base + 1_400) == 0
    assert await take(base + 1_400) == 600


async def test_a_lower_limit_counts_the_grants_already_in_the_window(target: Target) -> None:
    """A redeploy that lowers the limit waits for enough of the earlier grants to leave."""
    rate = _rate(target)
    base = 1_700_000_000_000
    for t in range(4):
        assert await rate.take_token(RateRequest("rate:conformance.c", 4, 1_000, base + t)) == 0
    assert await rate.take_token(RateRequest("rate:conformance.c", 2, 1_000, base + 10)) == 992
    assert await rate.take_token(RateRequest("rate:conformance.c", 2, 1_000, base + 1_002)) == 0


async def test_the_store_clock_decides_when_no_instant_is_given(target: Target) -> None:
    """Workers send no instant: the store's own clock measures the window."""
    rate = _rate(target)
    req = RateRequest("rate:conformance.d", 2, 400)
    assert [await rate.take_token(req) for _ in range(2)] == [0, 0]
    wait = await rate.take_token(req)
    assert 0 < wait <= 400
    await target.advance(wait + 60)
    assert await rate.take_token(req) == 0


async def test_bad_token_requests_are_refused(target: Target) -> None:
    """An empty key, a limit outside 1..10,000 or a window outside 1 ms..1 day is refused."""
    rate = _rate(target)
    for req in (
        RateRequest("", 1, 1_000),
        RateRequest("rate:x", 0, 1_000),
        RateRequest("rate:x", 10_001, 1_000),
        RateRequest("rate:x", 1, 0),
        RateRequest("rate:x", 1, 86_400_001),
    ):
        with pytest.raises(JobsError) as caught:
            await rate.take_token(req)
        assert caught.value.code == "X_DRIVER_REQUEST_INVALID"
    assert await rate.take_token(RateRequest("rate:x", 1, 1_000)) == 0


def _declare(registry: JobRegistry, name: str, rate: Rate, ran: list[int], **opts: Any) -> Any:
    @job(
        input=Call,
        idempotency_key=lambda c: f"{c.org}-{c.n}",
        tenant="none",
        name=name,
        registry=registry,
        rate=rate,
        **opts,
    )
    async def call(c: Call) -> int:
        ran.append(c.n)
        return c.n

    return call


async def _run_claimed(target: Target, registry: JobRegistry, jobs: list[ClaimedJob]) -> list[str]:
    env = AttemptEnv(target.driver, registry, target.clock or SYSTEM_CLOCK, 30_000)
    outcomes: list[str] = []
    for claimed in sorted(jobs, key=lambda j: j.input["n"] if isinstance(j.input, dict) else 0):
        outcomes.append(await execute(env, Attempt(claimed)))
    return outcomes


async def _info(target: Target, job_id: Any) -> JobInfo:
    info: JobInfo | None = await target.require("introspect").get(job_id)
    assert info is not None
    return info


async def test_a_limited_attempt_is_handed_back_due_when_the_next_token_is_free(
    target: Target,
) -> None:
    """``wait``: not failed, no attempt spent, due at the grant's instant plus the window."""
    _rate(target)
    registry = JobRegistry()
    ran: list[int] = []
    handle = _declare(
        registry, "conformance.rated", Rate(2, per="800ms", key=lambda c: c.org, margin=0), ran
    )
    with use_driver(target.driver):
        ids = [(await handle.enqueue(Call(org="o1", n=n))).id for n in range(3)]
        other = (await handle.enqueue(Call(org="o2", n=9))).id
    before = await target.driver.steps.now()
    outcomes = await _run_claimed(target, registry, await claim(target.driver, limit=10))
    after = await target.driver.steps.now()
    assert outcomes == ["completed", "completed", "deferred", "completed"]
    assert sorted(ran) == [0, 1, 9], "o2 has a bucket of its own"
    limited = await _info(target, ids[2])
    assert (str(limited.state), limited.attempt, limited.last_error_code) == ("delayed", 0, None)
    window = timedelta(milliseconds=800)
    assert before + window - timedelta(milliseconds=1) <= limited.run_at <= after + window
    assert str((await _info(target, other)).state) == "done"
    assert await claim(target.driver) == [], "not due before the token is free"
    await target.advance(900)
    again = await claim(target.driver)
    assert [(j.id, j.attempt) for j in again] == [(ids[2], 1)], "the attempt was not spent"
    assert await _run_claimed(target, registry, again) == ["completed"]


async def test_fail_mode_fails_the_attempt_under_the_retry_policy(target: Target) -> None:
    """``fail``: ``X_JOB_RATE_LIMITED``, the attempt spent, retried by the backoff.

    At the last attempt the row is buried as any failure is.
    """
    _rate(target)
    registry = JobRegistry()
    ran: list[int] = []
    retry = Retry(attempts=2, backoff="fixed", delay="200ms", jitter=False)
    handle = _declare(
        registry, "conformance.rated-fail", Rate(1, per="1h", when_limited="fail"), ran, retry=retry
    )
    with use_driver(target.driver):
        first = (await handle.enqueue(Call(org="o", n=0))).id
        second = (await handle.enqueue(Call(org="o", n=1))).id
    outcomes = await _run_claimed(target, registry, await claim(target.driver, limit=10))
    assert outcomes == ["completed", "retried"]
    assert ran == [0]
    info = await _info(target, second)
    assert (str(info.state), info.attempt, info.last_error_code) == (
        "delayed",
        1,
        "X_JOB_RATE_LIMITED",
    )
    await target.advance(300)
    again = await claim(target.driver)
    assert [(j.id, j.attempt) for j in again] == [(second, 2)]
    assert await _run_claimed(target, registry, again) == ["dead-lettered"]
    info = await _info(target, second)
    assert (str(info.state), info.last_error_code) == ("dead", "X_JOB_MAX_ATTEMPTS")
    assert "X_JOB_RATE_LIMITED" in (info.last_error or "")
    assert str((await _info(target, first)).state) == "done"
