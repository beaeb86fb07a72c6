"""Retry policy: the nominal schedule, the cap, equal jitter (C20) and policy validation."""

from __future__ import annotations

import math
import random
import statistics
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs_core.retry import RETRY_AFTER_SPREAD, Retry, retry_schedule

PROPERTY_SETTINGS = settings(max_examples=300, deadline=None)

backoffs = st.sampled_from(["exponential", "linear", "fixed"])
delays_ms = st.integers(min_value=1, max_value=10**7)
caps_ms = st.integers(min_value=1, max_value=10**8)
failed_attempts = st.integers(min_value=1, max_value=200)


def test_spec_example_exponential_schedule() -> None:
    policy = Retry(attempts=5, backoff="exponential", delay="1s", jitter=False)
    assert retry_schedule(policy) == [1000, 2000, 4000, 8000]


def test_spec_example_holds_with_default_jitter_because_the_schedule_is_nominal() -> None:
    assert retry_schedule(Retry(attempts=5, backoff="exponential", delay="1s")) == [
        1000,
        2000,
        4000,
        8000,
    ]


def test_linear_schedule() -> None:
    policy = Retry(attempts=5, backoff="linear", delay="500ms", jitter=False)
    assert retry_schedule(policy) == [500, 1000, 1500, 2000]


def test_fixed_schedule() -> None:
    policy = Retry(attempts=4, backoff="fixed", delay="2s", jitter=False)
    assert retry_schedule(policy) == [2000, 2000, 2000]


def test_max_delay_caps_the_schedule() -> None:
    policy = Retry(attempts=8, backoff="exponential", delay="1s", max_delay="5s", jitter=False)
    assert retry_schedule(policy) == [1000, 2000, 4000, 5000, 5000, 5000, 5000]
    linear = Retry(attempts=6, backoff="linear", delay="2s", max_delay="7s")
    assert retry_schedule(linear) == [2000, 4000, 6000, 7000, 7000]


def test_single_attempt_has_no_retries() -> None:
    assert retry_schedule(Retry(attempts=1)) == []


def test_durations_in_any_accepted_form() -> None:
    policy = Retry(attempts=3, delay=timedelta(seconds=3), max_delay=90_000, jitter=False)
    assert policy.delay_ms == 3000
    assert policy.max_delay_ms == 90_000
    assert retry_schedule(policy) == [3000, 6000]


def test_default_policy() -> None:
    policy = Retry()
    assert policy.attempts == 3
    assert policy.backoff == "exponential"
    assert policy.jitter is True
    assert policy.dead_letter is True
    assert policy.delay_ms == 1000
    assert policy.max_delay_ms == 300_000
    assert policy.problems() == []


def test_huge_attempt_numbers_stay_capped() -> None:
    policy = Retry(attempts=10_000, delay="1s", max_delay="5m", jitter=False)
    assert policy.nominal_delay_ms(5_000) == 300_000
    assert policy.delay_after_ms(10_000) == 300_000


def test_without_jitter_the_delay_is_the_nominal_one() -> None:
    policy = Retry(attempts=5, delay="1s", jitter=False)
    assert [policy.delay_after_ms(n) for n in range(1, 5)] == [1000, 2000, 4000, 8000]


@PROPERTY_SETTINGS
@given(
    backoff=backoffs,
    delay=delays_ms,
    cap=caps_ms,
    attempt=failed_attempts,
    seed=st.integers(0, 2**32),
)
def test_equal_jitter_stays_within_half_and_full_nominal_and_under_the_cap(
    backoff: str, delay: int, cap: int, attempt: int, seed: int
) -> None:
    policy = Retry(attempts=3, backoff=backoff, delay=delay, max_delay=cap)  # type: ignore[arg-type]
    nominal = policy.nominal_delay_ms(attempt)
    assert 0 < nominal <= cap
    jittered = policy.delay_after_ms(attempt, random.Random(seed))
    # Never sooner than half the nominal delay (the module's promise), never above it or the cap.
    assert 2 * jittered >= nominal
    assert jittered <= nominal <= cap


@PROPERTY_SETTINGS
@given(nominal=st.integers(-(10**12), 10**12), cap=caps_ms, seed=st.integers(0, 2**32))
def test_jittered_never_exceeds_max_delay_nor_goes_negative(
    nominal: int, cap: int, seed: int
) -> None:
    policy = Retry(max_delay=cap)
    out = policy.jittered(nominal, random.Random(seed))
    assert 0 <= out <= cap
    capped = min(max(nominal, 0), cap)
    assert 2 * out >= capped


@PROPERTY_SETTINGS
@given(attempts=st.integers(1, 60), backoff=backoffs, delay=delays_ms, cap=caps_ms)
def test_schedule_has_one_delay_per_retry_and_never_shrinks(
    attempts: int, backoff: str, delay: int, cap: int
) -> None:
    policy = Retry(attempts=attempts, backoff=backoff, delay=delay, max_delay=cap)  # type: ignore[arg-type]
    schedule = retry_schedule(policy)
    assert len(schedule) == attempts - 1
    assert all(0 < d <= cap for d in schedule)
    assert schedule == sorted(schedule)
    if backoff == "fixed":
        assert set(schedule) <= {min(delay, cap)}


def test_c20_jittered_retries_of_one_round_are_spread_not_synchronised() -> None:
    # 1,000 jobs failing together on attempt 3 of a 1 s exponential policy (nominal 4 s).
    policy = Retry(attempts=5, backoff="exponential", delay="1s")
    rng = random.Random(20)
    delays = [policy.delay_after_ms(3, rng) for _ in range(1_000)]
    assert min(delays) >= 2000
    assert max(delays) <= 4000
    # Uniform over a 2 s window: stdev ~577 ms. Lockstep retries would have stdev 0.
    assert statistics.stdev(delays) > 400
    assert max(delays) - min(delays) > 1_800
    assert len(set(delays)) > 500
    # No single 10 ms slot holds more than a small share of the herd.
    buckets: dict[int, int] = {}
    for d in delays:
        buckets[d // 10] = buckets.get(d // 10, 0) + 1
    assert max(buckets.values()) < 30


def test_default_jitter_without_a_seed_still_spreads() -> None:
    policy = Retry(attempts=5)
    delays = {policy.delay_after_ms(4) for _ in range(200)}
    assert len(delays) > 50
    assert all(4000 <= d <= 8000 for d in delays)


def test_seeded_rng_is_reproducible() -> None:
    policy = Retry(attempts=6, delay="1s", max_delay="1m")
    first = [policy.delay_after_ms(n, random.Random(7)) for n in range(1, 6)]
    again = [policy.delay_after_ms(n, random.Random(7)) for n in range(1, 6)]
    assert first == again
    rng_a, rng_b = random.Random(99), random.Random(99)
    assert [policy.delay_after_ms(2, rng_a) for _ in range(50)] == [
        policy.delay_after_ms(2, rng_b) for _ in range(50)
    ]
    other = [policy.delay_after_ms(2, random.Random(s)) for s in range(50)]
    assert len(set(other)) > 1


def test_retry_after_is_clamped_by_max_delay_and_jittered_into_its_last_quarter() -> None:
    policy = Retry(max_delay="10s")
    rng = random.Random(1)
    outs = [policy.after_ms(60_000, rng) for _ in range(200)]
    assert all(7_500 <= o <= 10_000 for o in outs)
    assert len(set(outs)) > 1


def test_a_retry_after_under_the_cap_never_comes_sooner_than_named() -> None:
    """A dependency that said "retry in 30 s" is called back at 30 to 37.5 s, never sooner.

    Equal jitter (the backoff's) would call it back from 15 s on: refused again, an attempt
    spent.
    """
    policy = Retry(max_delay="5m")
    rng = random.Random(7)
    outs = [policy.after_ms(30_000, rng) for _ in range(500)]
    assert min(outs) >= 30_000
    assert max(outs) <= 30_000 + 30_000 * RETRY_AFTER_SPREAD
    assert len(set(outs)) > 100
    assert Retry(jitter=False).after_ms(30_000) == 30_000
    assert Retry(max_delay="10s", jitter=False).after_ms(60_000) == 10_000


@given(named=st.integers(0, 10**9), cap=st.integers(1, 10**8), seed=st.integers())
def test_a_retry_after_delay_is_never_sooner_than_named_below_the_cap(
    named: int, cap: int, seed: int
) -> None:
    policy = Retry(max_delay=cap)
    delay = policy.after_ms(named, random.Random(seed))
    if named < cap:
        assert named <= delay <= min(cap, named + named * RETRY_AFTER_SPREAD)
    else:
        assert cap - cap * RETRY_AFTER_SPREAD <= delay <= cap
    assert Retry(max_delay=cap, jitter=False).after_ms(named) == min(named, cap)


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        (Retry(attempts=0), "retry.attempts"),
        (Retry(attempts=-3), "retry.attempts"),
        (Retry(attempts=True), "retry.attempts"),
        (Retry(attempts=2.5), "retry.attempts"),  # type: ignore[arg-type]
        (Retry(attempts="3"), "retry.attempts"),  # type: ignore[arg-type]
        (Retry(backoff="quadratic"), "retry.backoff"),  # type: ignore[arg-type]
        (Retry(delay="0s"), "retry.delay"),
        (Retry(delay=-5), "retry.delay"),
        (Retry(delay="soon"), "retry.delay"),
        (Retry(delay=math.nan), "retry.delay"),
        (Retry(delay=math.inf), "retry.delay"),
        (Retry(delay=True), "retry.delay"),
        (Retry(max_delay=timedelta(seconds=-1)), "retry.max_delay"),
        (Retry(max_delay=0), "retry.max_delay"),
        (Retry(max_delay=None), "retry.max_delay"),  # type: ignore[arg-type]
    ],
)
def test_problems_name_the_bad_field(policy: Retry, field: str) -> None:
    problems = policy.problems()
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{field}:")


def test_problems_lists_every_bad_field_at_once() -> None:
    policy = Retry(attempts=0, backoff="nope", delay="-1s", max_delay=math.nan)  # type: ignore[arg-type]
    problems = policy.problems()
    assert [p.split(":")[0] for p in problems] == [
        "retry.attempts",
        "retry.backoff",
        "retry.delay",
        "retry.max_delay",
    ]


def test_retry_is_frozen() -> None:
    policy = Retry()
    with pytest.raises(AttributeError):
        policy.attempts = 9  # type: ignore[misc]
