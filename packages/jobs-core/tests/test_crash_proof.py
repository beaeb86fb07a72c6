"""crash_proof: the in-process crash check app authors run on their own jobs."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from jobs_core import JobRegistry, Retry, job
from jobs_core.errors import CrashDivergedError
from jobs_core.testing import crash_proof


class Signup(BaseModel):
    user: str


def signup_job(registry: JobRegistry, name: str, **options: Any) -> Any:
    return job(
        input=Signup,
        idempotency_key=lambda i: i.user,
        tenant="none",
        name=name,
        registry=registry,
        retry=Retry(attempts=3, delay="100ms"),
        **options,
    )


async def test_a_job_with_effects_in_steps_is_crash_proof(registry: JobRegistry) -> None:
    sent: list[str] = []

    def send(kind: str, user: str) -> str:
        sent.append(f"{kind}:{user}")
        return "ok"

    @signup_job(registry, "app.welcome")
    async def welcome(input: Signup, step: Any, ctx: Any) -> None:
        await step.run("welcome", send, "welcome", input.user)
        await step.sleep("wait-a-day", "1d")
        await step.run("nudge", send, "nudge", input.user)

    report = await crash_proof(welcome, Signup(user="ada"), effects=lambda: sent)

    assert report.outcome == ("done", None)
    assert report.effects == {"welcome:ada": 1, "nudge:ada": 1}
    # welcome (3) + the sleep's two writes (2 x 2) + nudge (3)
    assert len(report.kill_points) == 10
    assert [str(k) for k in report.kill_points[:3]] == [
        "#0 before 'welcome'",
        "#1 returned 'welcome'",
        "#2 persisted 'welcome'",
    ]
    # Clean run once, plus one run per kill point; a kill at 'returned' reruns that step.
    assert sent.count("welcome:ada") == 1 + 10 + 1
    assert sent.count("nudge:ada") == 1 + 10 + 1


async def test_an_effect_outside_a_step_is_crash_diverged(registry: JobRegistry) -> None:
    sent: list[str] = []

    def send(kind: str, user: str) -> str:
        sent.append(f"{kind}:{user}")
        return "ok"

    @signup_job(registry, "app.leaky")
    async def leaky(input: Signup, step: Any, ctx: Any) -> None:
        sent.append(f"audit:{input.user}")  # outside any step: repeats on every replay
        await step.run("welcome", send, "welcome", input.user)
        await step.run("nudge", send, "nudge", input.user)

    with pytest.raises(CrashDivergedError) as raised:
        await crash_proof(leaky, Signup(user="ada"), effects=lambda: sent)

    assert raised.value.code == "X_JOB_CRASH_DIVERGED"
    assert raised.value.meta["kind"] == "extra-effect"
    assert raised.value.meta["effect"] == "audit:ada"
    assert (raised.value.meta["seen"], raised.value.meta["clean"]) == (2, 1)
    assert "outside every step" in str(raised.value)


async def test_without_an_effect_log_step_completions_are_counted(registry: JobRegistry) -> None:
    @signup_job(registry, "app.count")
    async def counted(input: Signup, step: Any, ctx: Any) -> str:
        first = await step.run("first", lambda: 1)
        second = await step.run("second", lambda: 2)
        return f"{first}+{second}"

    report = await crash_proof(counted, Signup(user="ada"))
    assert report.effects == {"first": 1, "second": 1}
    assert len(report.kill_points) == 6


async def test_a_once_step_killed_mid_flight_is_reported_unknown_not_rerun(
    registry: JobRegistry,
) -> None:
    charged: list[str] = []

    @signup_job(registry, "app.charge")
    async def charge(input: Signup, step: Any, ctx: Any) -> None:
        await step.run("charge", lambda: charged.append(input.user), once=True)

    report = await crash_proof(charge, Signup(user="ada"), effects=lambda: charged)
    assert report.outcome == ("done", None)
    # clean 1, killed at before (rerun: 1), at returned (ran once, then unknown: 1), persisted 1
    assert len(charged) == 4


async def test_compensations_run_once_per_compensated_step(registry: JobRegistry) -> None:
    log: list[str] = []

    def book(what: str) -> str:
        log.append(what)
        return what

    def fail() -> None:
        raise PermissionError("card declined")

    @signup_job(registry, "app.trip", compensates=True)
    async def trip(input: Signup, step: Any, ctx: Any) -> None:
        await step.run("hotel", book, "hotel", compensate=lambda out: log.append(f"undo:{out}"))
        await step.run("pay", fail)

    report = await crash_proof(trip, Signup(user="ada"), effects=lambda: log)
    assert report.outcome[0] == "dead"
    assert report.effects == {"hotel": 1, "undo:hotel": 1}
    assert [str(k) for k in report.kill_points] == [
        "#0 before 'hotel'",
        "#1 returned 'hotel'",
        "#2 persisted 'hotel'",
        "#3 before 'pay'",
        "#4 before 'compensate:hotel'",
        "#5 returned 'compensate:hotel'",
        "#6 persisted 'compensate:hotel'",
    ]
