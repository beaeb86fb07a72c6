"""Durations: every accepted spelling normalised to int ms; every bad one refused by name."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs_core._durations import MAX_DURATION_MS, duration_problem, parse_duration


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        ("250ms", 250),
        ("30s", 30_000),
        ("10m", 600_000),
        ("1h", 3_600_000),
        ("3d", 259_200_000),
        ("2w", 1_209_600_000),
        ("1.5s", 1_500),
        (" 30s ", 30_000),
        ("30 s", 30_000),
        (timedelta(seconds=90), 90_000),
        (timedelta(days=3), 259_200_000),
        (timedelta(microseconds=1), 1),  # rounded up: a positive value never becomes 0
        (42, 42),
        (0.4, 1),
        (1500.0, 1500),
        ("100ms", 100),
    ],
)
def test_accepted_spellings(value: object, ms: int) -> None:
    out = parse_duration(value, field="timeout")  # type: ignore[arg-type]
    assert out == ms
    assert type(out) is int


@pytest.mark.parametrize("value", [0, "0s", "0ms", timedelta(0), 0.0])
def test_zero_refused_unless_allowed(value: object) -> None:
    with pytest.raises(ValueError, match=r"^step_timeout: .*positive"):
        parse_duration(value, field="step_timeout")  # type: ignore[arg-type]
    assert parse_duration(value, field="delay", allow_zero=True) == 0  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "value",
    [
        -1,
        -86_400_000,
        "-1s",
        timedelta(seconds=-1),
        timedelta(microseconds=-1),
        -0.5,
        -0.000001,
        math.nan,
        math.inf,
        -math.inf,
        True,
        False,
        "garbage",
        "",
        "10",
        "10 minutes",
        "1e3ms",
        "30S",
        "3y",
        "9" * 400 + "ms",
        None,
        [1000],
        b"30s",
        10**18,
        MAX_DURATION_MS + 1,
        1e300,
        "36501d",
    ],
)
def test_refused_with_the_field_named(value: object) -> None:
    # Refused whether or not zero is allowed, and always as ValueError naming the field.
    for allow_zero in (False, True):
        with pytest.raises(ValueError) as caught:
            parse_duration(value, field="my_field", allow_zero=allow_zero)  # type: ignore[arg-type]
        assert str(caught.value).startswith("my_field: ")
        assert duration_problem(value, allow_zero=allow_zero) is not None


def test_the_largest_duration_is_accepted() -> None:
    assert parse_duration(MAX_DURATION_MS, field="timeout") == MAX_DURATION_MS
    assert parse_duration("36500d", field="timeout") == MAX_DURATION_MS


def test_message_tells_how_to_write_a_duration() -> None:
    with pytest.raises(ValueError) as caught:
        parse_duration("soon", field="timeout")
    assert "'soon'" in str(caught.value)
    assert "'250ms'" in str(caught.value)


def test_duration_problem_is_none_for_good_values() -> None:
    assert duration_problem("30s") is None
    assert duration_problem(0) is not None
    assert duration_problem(0, allow_zero=True) is None


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_any_float_is_either_a_nonnegative_int_or_refused(value: float) -> None:
    try:
        out = parse_duration(value, field="delay", allow_zero=True)
    except ValueError as exc:
        assert str(exc).startswith("delay: ")
        assert not math.isfinite(value) or value < 0 or value > MAX_DURATION_MS
    else:
        assert value >= 0
        assert 0 <= out <= MAX_DURATION_MS
        assert out == math.ceil(value)


@settings(max_examples=200, deadline=None)
@given(st.timedeltas(min_value=timedelta(days=-1000), max_value=timedelta(days=1000)))
def test_a_negative_timedelta_is_never_accepted(value: timedelta) -> None:
    problem = duration_problem(value, allow_zero=True)
    assert (problem is None) == (value >= timedelta(0))
