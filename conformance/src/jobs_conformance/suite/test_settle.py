"""Settle: ack, nack and heartbeat fenced on the claim; nack states; delays; attempt counting."""

from __future__ import annotations

import itertools

import pytest

from jobs_conformance.target import Target, claim, request, state_counts
from jobs_core.types import ClaimedJob, ErrorInfo, Fence, JobState, NackOptions, Settle, nack_state


async def _one(
    target: Target, key: str = "a", vt: int = 30_000, max_attempts: int = 3
) -> ClaimedJob:
    await target.driver.enqueue(request(key, max_attempts=max_attempts))
    [held] = await claim(target.driver, vt=vt)
    return held


def _strangers(held: ClaimedJob) -> list[Fence]:
    return [
        Fence("someone-else", held.claim),
        Fence(held.worker_id, held.claim + 1),
        Fence(held.worker_id, held.claim - 1),
    ]


async def test_ack_is_fenced_on_the_claim(target: Target) -> None:
    """Only the claim's own (worker, ordinal) acks; a second ack finds the row settled."""
    driver = target.driver
    held = await _one(target)
    for fence in _strangers(held):
        assert not await driver.ack(held.id, Settle(fence))
    assert state_counts(await driver.stats()) == {"running": 1}
    assert await driver.ack(held.id, Settle(held.fence, result={"ok": True}))
    assert not await driver.ack(held.id, Settle(held.fence))
    assert state_counts(await driver.stats()) == {"done": 1}


async def test_nack_is_fenced_on_the_claim(target: Target) -> None:
    """Only the claim's own (worker, ordinal) nacks; the row is untouched otherwise."""
    driver = target.driver
    held = await _one(target)
    for fence in _strangers(held):
        assert not await driver.nack(held.id, NackOptions(fence, dead_letter=True))
    assert state_counts(await driver.stats()) == {"running": 1}
    assert await driver.nack(held.id, NackOptions(held.fence, error=ErrorInfo("boom", "X_BOOM")))
    assert not await driver.nack(held.id, NackOptions(held.fence, dead_letter=True))
    assert state_counts(await driver.stats()) == {"ready": 1}


async def test_heartbeat_is_fenced_and_renews_the_lease(target: Target) -> None:
    """A renewal by the claim keeps the row; a stranger's renewal is refused."""
    driver = target.driver
    held = await _one(target, vt=400)
    for fence in _strangers(held):
        assert not await driver.heartbeat(held.id, fence, 400)
    await target.advance(250)
    assert await driver.heartbeat(held.id, held.fence, 400)
    await target.advance(250)
    assert await claim(driver, worker="w2") == [], "a renewed lease must not lapse"
    assert await driver.heartbeat(held.id, held.fence, 400)
    await target.advance(600)
    [taken] = await claim(driver, worker="w2")
    assert (taken.id, taken.claim) == (held.id, 2)
    assert not await driver.heartbeat(held.id, held.fence, 400)
    assert await driver.ack(taken.id, Settle(taken.fence))
    assert not await driver.heartbeat(taken.id, taken.fence, 400)


FLAGS = list(itertools.product([False, True], repeat=4))


@pytest.mark.parametrize(
    ("dead_letter", "fail", "park", "delayed"),
    FLAGS,
    ids=["-".join(n for n, on in zip("dfpl", f, strict=True) if on) or "none" for f in FLAGS],
)
async def test_nack_settles_in_nack_state(
    target: Target, dead_letter: bool, fail: bool, park: bool, delayed: bool
) -> None:
    """Every flag combination lands in ``nack_state(opts)``, and only ready rows are claimable."""
    driver = target.driver
    held = await _one(target)
    opts = NackOptions(
        held.fence,
        dead_letter=dead_letter,
        fail=fail,
        park=park,
        delay_ms=60_000 if delayed else 0,
    )
    expected = nack_state(opts)
    assert await driver.nack(held.id, opts)
    counted = JobState.READY if expected is JobState.DELAYED and not delayed else expected
    assert state_counts(await driver.stats()) == {counted.value: 1}
    claimable = expected in (JobState.READY, JobState.SUSPENDED) and not delayed
    assert [c.id for c in await claim(driver)] == ([held.id] if claimable else [])
    again = await driver.enqueue(request("a"))
    assert again.deduped is (expected not in (JobState.DEAD, JobState.FAILED))


async def test_a_nack_delay_is_honoured(target: Target) -> None:
    """A retry and a park due later are not claimable before their delay, and are after."""
    driver = target.driver
    for park in (False, True):
        held = await _one(target, key=f"park-{park}")
        opts = NackOptions(held.fence, delay_ms=400, park=park, count_attempt=not park)
        assert await driver.nack(held.id, opts)
        await target.advance(100)
        assert await claim(driver) == []
        await target.advance(500)
        [again] = await claim(driver)
        assert again.id == held.id
        assert await driver.ack(again.id, Settle(again.fence))


async def test_park_never_counts_an_attempt_retry_and_lapse_do(target: Target) -> None:
    """Attempts: a park or an uncounted hand-back keep it, a retry and a lapse spend one."""
    driver = target.driver
    held = await _one(target, max_attempts=5)
    assert held.attempt == 1
    assert await driver.nack(held.id, NackOptions(held.fence, park=True, count_attempt=False))
    [held] = await claim(driver, vt=300)
    assert held.attempt == 1
    # A park that says count_attempt=True still does not spend an attempt.
    assert await driver.nack(held.id, NackOptions(held.fence, park=True))
    [held] = await claim(driver, vt=300)
    assert held.attempt == 1
    assert await driver.nack(held.id, NackOptions(held.fence, count_attempt=False))
    [held] = await claim(driver, vt=300)
    assert held.attempt == 1
    assert await driver.nack(held.id, NackOptions(held.fence))
    [held] = await claim(driver, vt=300)
    assert held.attempt == 2
    await target.advance(500)
    [held] = await claim(driver, vt=300)
    assert held.attempt == 3
    assert held.max_attempts == 5


async def test_settles_after_a_lapse_and_reclaim_are_refused(target: Target) -> None:
    """Once another claimant took a lapsed row, nothing the first one sends lands."""
    driver = target.driver
    held = await _one(target, vt=300)
    await target.advance(500)
    [taken] = await claim(driver, worker="w2")
    assert not await driver.ack(held.id, Settle(held.fence))
    assert not await driver.nack(held.id, NackOptions(held.fence, dead_letter=True))
    assert not await driver.heartbeat(held.id, held.fence, 30_000)
    assert state_counts(await driver.stats()) == {"running": 1}
    assert await driver.nack(taken.id, NackOptions(taken.fence, fail=True))
    assert state_counts(await driver.stats()) == {"failed": 1}
