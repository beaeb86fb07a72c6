"""Crash-proof: each reference job killed at every step boundary recovers as a clean run.

With a ``crash_worker_command`` the kills are real SIGKILLs of worker subprocesses; without one
(the memory driver) the attempt is cancelled at the boundary in-process and its lease abandoned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from jobs_conformance import reference
from jobs_conformance.crash import SubprocessRun
from jobs_conformance.plugin import KILL_POINTS
from jobs_conformance.target import Target
from jobs_core._crash import (
    CrashReport,
    InProcessRun,
    check_recovery,
    kill_points,
)
from jobs_core.driver import ChildJobs, capability
from jobs_core.errors import CrashDivergedError
from jobs_core.job import JobHandle, JobRegistry

WorkerCommand = Callable[[str], Sequence[str]] | None


async def _check(
    target: Target,
    command: WorkerCommand,
    handle: JobHandle[Any, Any],
    workdir: Path,
    items: int = 6,
    parents: list[Any] | None = None,
) -> CrashReport:
    """Run the clean scenario, then one killed at each boundary, checking every recovery.

    ``items`` is the input's; ``parents`` (when given) collects each scenario's final row, read
    through ``introspect`` (subprocess runs only).
    """
    if command is not None:
        watcher = await target.real_time() if target.manual else target.driver
        runner = SubprocessRun(watcher, command, workdir, reference.EVENTS, timeout_s=600.0)

        async def scenario(kill_at: int | None) -> Any:
            result = await runner.run(handle, kill_at, items)
            introspect = capability(watcher, "introspect")
            if parents is not None and introspect is not None and runner.last is not None:
                parents.append(await introspect.get(runner.last.id))
            return result

        try:
            return await _kill_everywhere(scenario, handle)
        finally:
            await target.release(watcher)

    else:
        registry = JobRegistry()
        registry.register(handle)
        for child in reference.CHILDREN.get(handle.name.removeprefix(reference.PREFIX), ()):
            registry.register(child)
        logs = iter(range(1_000_000))
        in_process = InProcessRun(
            target.driver, registry, target.clock, 1_000, reference.EVENTS, None
        )

        async def scenario(kill_at: int | None) -> Any:
            log = workdir / f"{handle.name}-{next(logs)}.log"
            in_process.effects = lambda: reference.effects_of(str(log))
            tag = log.stem.replace(".", "-")
            value = reference.RefInput(log=str(log), tag=tag, items=items)
            return await in_process.run(handle, value, kill_at)

    return await _kill_everywhere(scenario, handle)


async def _kill_everywhere(
    scenario: Callable[[int | None], Any], handle: JobHandle[Any, Any]
) -> CrashReport:
    clean = await scenario(None)
    points = kill_points(clean)
    for kill in points:
        crashed = await scenario(kill.index)
        check_recovery(handle.name, clean, crashed, kill)
    return CrashReport(handle.name, (clean.state, clean.code), dict(clean.effects), tuple(points))


@pytest.mark.parametrize("name", sorted(reference.CRASH_PROOF))
async def test_a_reference_job_recovers_from_a_kill_at_every_boundary(
    target: Target,
    crash_worker_command: WorkerCommand,
    name: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """Killed at each boundary, the job settles as a clean run with no effect repeated."""
    handle, boundaries = reference.CRASH_PROOF[name]
    if name == "wait":
        target.require("events")
    report = await _check(target, crash_worker_command, handle, tmp_path)
    assert len(report.kill_points) == boundaries, [str(k) for k in report.kill_points]
    assert report.outcome[0] in ("done", "dead")
    request.config.stash[KILL_POINTS].append((name, len(report.kill_points)))
    request.node.user_properties.append(("kill_points", len(report.kill_points)))


async def test_an_effect_outside_a_step_is_flagged(
    target: Target, crash_worker_command: WorkerCommand, tmp_path: Path
) -> None:
    """The harness catches a job whose effect repeats on replay: X_JOB_CRASH_DIVERGED."""
    with pytest.raises(CrashDivergedError) as raised:
        await _check(target, crash_worker_command, reference.leaky, tmp_path)
    assert raised.value.code == "X_JOB_CRASH_DIVERGED"
    assert raised.value.meta["effect"] == "audit"
    assert raised.value.meta["kind"] == "extra-effect"


@pytest.mark.parametrize(
    "items",
    [10, pytest.param(100, marks=[pytest.mark.slow, pytest.mark.timeout(3_600)])],
)
async def test_a_fan_out_parent_recovers_from_a_kill_at_every_boundary(
    target: Target,
    crash_worker_command: WorkerCommand,
    items: int,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """A fan-out parent killed at each of its boundaries recovers; its children ran once each.

    The sum of the ``items`` children is right, and they ran while the parent waited on a
    one-slot worker. Every worker has ``concurrency=1``: a parent that held its slot while
    waiting would leave no slot for its children and never settle. ``event_poll="1h"``: only
    the children's settle events wake it in time.
    """
    target.require("events")
    parents: list[Any] = []
    report = await _check(
        target, crash_worker_command, reference.fan_out, tmp_path, items=items, parents=parents
    )
    total = sum(range(items))
    assert len(report.kill_points) == reference.FAN_OUT_BOUNDARIES, [
        str(k) for k in report.kill_points
    ]
    assert report.outcome == ("done", None)
    assert dict(report.effects) == {
        "plan": 1,
        f"sum:{total}": 1,
        **{f"child:{n}": 1 for n in range(items)},
    }
    store: ChildJobs = target.require("children")
    while_parked: list[int] = []
    for parent in parents:
        assert parent is not None and parent.result == total
        # Each child settled between the parent's park (its wait written) and its resume (the
        # results written), while one-slot workers served the queue: the parked parent held no
        # slot. One clock stamps both (the backend's).
        (wait,) = [s for s in parent.steps if s.name == "children"]
        assert wait.status == "completed" and wait.started_at and wait.completed_at
        kids = await store.children(parent.run_id)
        assert len(kids) == items and {k.state.value for k in kids} == {"done"}
        while_parked.append(
            sum(1 for k in kids if wait.started_at <= k.updated_at <= wait.completed_at)
        )
    assert while_parked == [items] * len(parents)
    claims = [parent.claim for parent in parents]
    request.config.stash[KILL_POINTS].append((f"fanout-{items}", len(report.kill_points)))
    request.node.user_properties.append(("kill_points", len(report.kill_points)))
    request.node.user_properties.append(("parent_claims", claims))
    request.node.user_properties.append(("children_run_while_parent_parked", while_parked))
