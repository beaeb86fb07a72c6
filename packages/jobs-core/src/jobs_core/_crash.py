"""Crash-proof checks: kill a run at every step boundary and compare its effects with a clean run.

A *trace* is what one run of a job did, in order: the step boundaries the step runner announced
(:mod:`jobs_core.faults`) and the effects observed between them. A clean trace decides, for every
effect, the step that produced it (an effect seen between a step's ``before`` and ``returned``
belongs to that step; one seen anywhere else belongs to no step). Then, for each boundary *k* of
the clean trace, the job runs again and is killed exactly at *k*; a fresh worker takes the run
over once the killed attempt's lease lapses. The recovered run must:

* settle with the clean run's outcome (``state`` and error code), except that a ``once`` step
  killed between ``started`` and ``completed`` (its ``returned`` boundary) ends
  ``X_STEP_OUTCOME_UNKNOWN`` instead, its effect seen exactly once;
* show every effect of the clean run at least once;
* show each effect exactly as often as the clean run, except the effects of the step killed at
  its ``returned`` boundary (it ran, its output was not persisted, so it runs again: at most
  twice as often). Compensators are steps (``compensate:<name>``), so the same rule means each
  compensation runs exactly once outside the kill window.

Anything else raises :class:`~jobs_core.errors.CrashDivergedError` (``X_JOB_CRASH_DIVERGED``): an
effect produced more often than the clean run outside the kill window is an effect that lives
outside a step. This module holds the analysis, shared with the ``jobs-conformance`` suite (whose
kills are real SIGKILLs of worker subprocesses), and the in-process runner behind
:func:`jobs_core.testing.crash_proof`, where a kill raises :class:`SimulatedKill` out of the
attempt at the boundary and leaves its lease to lapse.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol
from uuid import UUID

from jobs_core._durations import Duration, parse_duration
from jobs_core.clock import Clock
from jobs_core.driver import JobDriver, PublishRequest, capability
from jobs_core.errors import CrashDivergedError, StepOutcomeUnknownError
from jobs_core.faults import Boundary, install_fault_hook
from jobs_core.job import JobHandle, JobRegistry
from jobs_core.types import LIVE_STATES, JobState, JSONValue
from jobs_core.worker import Worker


class SettableClock(Clock, Protocol):
    """A clock tests can move: :class:`jobs_core.testing.ManualClock`."""

    def advance(self, by: Duration) -> datetime:
        """Move forward by ``by``; answer the new now."""
        ...

    def set(self, instant: datetime) -> None:
        """Jump forward to ``instant``."""
        ...


EventKind = Literal["before", "returned", "persisted", "effect"]

TraceEvent = tuple[EventKind, str]
"""One thing a run did: ``(point, step)`` for a boundary, ``("effect", label)`` for an effect."""


@dataclass(frozen=True, slots=True)
class KillPoint:
    """A boundary of the clean trace at which a run is killed.

    Attributes:
        index: its position among the clean trace's boundaries (0-based).
        point: ``before``, ``returned`` or ``persisted``.
        step: the step (``compensate:<name>`` for a compensator).
    """

    index: int
    point: str
    step: str

    def __str__(self) -> str:
        return f"#{self.index} {self.point} {self.step!r}"


@dataclass(frozen=True, slots=True)
class RunResult:
    """How one run ended and what it did.

    Attributes:
        state: the row's final state (``done``, ``dead``, ``failed``, ...).
        code: the row's last error code, if the driver shows it.
        events: the trace.
        once_steps: names of the run's ``once`` steps.
    """

    state: str
    code: str | None
    events: tuple[TraceEvent, ...]
    once_steps: frozenset[str] = frozenset()

    @property
    def boundaries(self) -> list[tuple[str, str]]:
        """The trace's boundaries, in order."""
        return [(kind, name) for kind, name in self.events if kind != "effect"]

    @property
    def effects(self) -> Counter[str]:
        """How often each effect was seen."""
        return Counter(name for kind, name in self.events if kind == "effect")


@dataclass(frozen=True, slots=True)
class CrashReport:
    """What a crash-proof check exercised.

    Attributes:
        job: the job name.
        outcome: the clean run's ``(state, code)``.
        effects: the clean run's effects and how often each was seen.
        kill_points: every boundary the run was killed at, in order.
    """

    job: str
    outcome: tuple[str, str | None]
    effects: Mapping[str, int]
    kill_points: tuple[KillPoint, ...]


def kill_points(clean: RunResult) -> list[KillPoint]:
    """Answer every boundary of a clean run, each a point to kill a crashed run at."""
    return [KillPoint(i, point, step) for i, (point, step) in enumerate(clean.boundaries)]


def owners(clean: RunResult) -> dict[str, str | None]:
    """Answer the step each effect of a clean run belongs to (``None``: outside every step).

    An effect seen outside a step, or inside two different steps, belongs to no step.
    """
    owner: dict[str, str | None] = {}
    current: str | None = None
    for kind, name in clean.events:
        if kind == "before":
            current = name
        elif kind != "effect":
            current = None
        elif name in owner and owner[name] != current:
            owner[name] = None
        else:
            owner[name] = current
    return owner


def _prefix_effects(clean: RunResult, kill: KillPoint) -> Counter[str]:
    seen = -1
    counts: Counter[str] = Counter()
    for kind, name in clean.events:
        if kind == "effect":
            counts[name] += 1
        else:
            seen += 1
            if seen == kill.index:
                break
    return counts


def check_recovery(job: str, clean: RunResult, crashed: RunResult, kill: KillPoint) -> None:
    """Check that a run killed at ``kill`` recovered as the module docstring says.

    Raises:
        CrashDivergedError: ``X_JOB_CRASH_DIVERGED``; ``meta["kind"]`` is ``outcome``,
            ``extra-effect`` or ``missing-effect``.
    """
    where = f"{job} killed at {kill}"
    unknown = kill.point == "returned" and kill.step in clean.once_steps
    expected = (
        (str(JobState.DEAD), StepOutcomeUnknownError.code) if unknown else (clean.state, clean.code)
    )
    got = (crashed.state, crashed.code)
    if got[0] != expected[0] or (got[1] != expected[1] and None not in (got[1], expected[1])):
        raise CrashDivergedError(
            f"{where}: settled {got} but a clean run settles {expected}",
            kind="outcome",
            job=job,
            kill=str(kill),
        )
    want = _prefix_effects(clean, kill) if unknown else clean.effects
    owner = owners(clean)
    have = crashed.effects
    for label in sorted(set(want) | set(have)):
        n, c = have.get(label, 0), want.get(label, 0)
        ceiling = c
        if not unknown and kill.point == "returned" and owner.get(label) == kill.step:
            ceiling = 2 * c
        if n > ceiling:
            outside = owner.get(label, "?") is None
            raise CrashDivergedError(
                f"{where}: effect {label!r} happened {n} times, a clean run {c}"
                + (" (it happens outside every step: move it into step.run)" if outside else ""),
                kind="extra-effect",
                job=job,
                kill=str(kill),
                effect=label,
                seen=n,
                clean=c,
            )
        if n < c:
            raise CrashDivergedError(
                f"{where}: effect {label!r} happened {n} times, a clean run {c}",
                kind="missing-effect",
                job=job,
                kill=str(kill),
                effect=label,
                seen=n,
                clean=c,
            )


class SimulatedKill(asyncio.CancelledError):
    """Raised out of an attempt at a chosen boundary: the in-process stand-in for SIGKILL.

    A :class:`~asyncio.CancelledError` so that the attempt task ends cancelled, passing every
    ``except Exception`` on the way without settling, writing or logging anything, and leaving its
    lease to lapse as a killed process would.
    """


@dataclass(slots=True)
class _Recorder:
    """The fault hook of one in-process run: records the trace and kills at one boundary."""

    run_id: UUID
    kill_at: int | None
    effects: Callable[[], Sequence[Hashable]] | None
    events: list[TraceEvent] = field(default_factory=list)
    boundaries: int = 0
    seen_effects: int = 0
    killed: bool = False

    def flush(self) -> None:
        """Append the effects observed since the last boundary."""
        if self.effects is None:
            return
        observed = list(self.effects())
        self.events.extend(("effect", str(label)) for label in observed[self.seen_effects :])
        self.seen_effects = len(observed)

    def __call__(self, at: Boundary) -> None:
        if at.run_id != self.run_id:
            return
        self.flush()
        if self.effects is None and at.point == "returned":
            # Without an effect log, a step's function completing is its effect.
            self.events.append(("effect", at.step))
        self.events.append((at.point, at.step))
        index = self.boundaries
        self.boundaries += 1
        if index == self.kill_at:
            self.killed = True
            raise SimulatedKill(f"simulated kill at {at.point} {at.step!r}")


@dataclass(slots=True)
class InProcessRun:
    """Runs one job on one driver with real workers, optionally killing it at a boundary.

    Attributes:
        driver: the driver (a fresh backend per run is not needed: each run has its own row).
        registry: the jobs the workers know.
        clock: the driver's manual clock, advanced past leases and delays; ``None`` to wait them
            out in real time.
        visibility_timeout_ms: each worker's lease; a killed attempt's row is taken over once it
            lapses.
        events: event payloads to publish when the run waits for an event of that name (a dict
            payload gets the wait's ``match`` keys added, so it matches this run's wait).
        effects: answers every effect observed so far (``None``: step completions count).
        timeout_s: real seconds one run may take.
    """

    driver: JobDriver
    registry: JobRegistry
    clock: SettableClock | None
    visibility_timeout_ms: int = 1_000
    events: Mapping[str, JSONValue] = field(default_factory=dict)
    effects: Callable[[], Sequence[Hashable]] | None = None
    timeout_s: float = 60.0

    def _worker(self, queue: str) -> Worker:
        return Worker(
            self.driver,
            queues=[queue],
            concurrency=1,
            visibility_timeout=self.visibility_timeout_ms,
            poll_interval="2ms",
            idle_poll_max="10ms",
            registry=self.registry,
            clock=self.clock,
        )

    async def run(self, handle: JobHandle[Any, Any], input: Any, kill_at: int | None) -> RunResult:
        """Enqueue ``input`` and drive it to a finished state; answer how it ended.

        Raises:
            TimeoutError: the run did not settle within ``timeout_s``.
            AssertionError: the kill point was never reached.
        """
        req = handle.build_request(input)
        baseline = await queue_counts(self.driver, req.queue)
        await self.driver.enqueue(req)
        recorder = _Recorder(req.run_id, kill_at, self.effects)
        if self.effects is not None:
            recorder.seen_effects = len(self.effects())
        install_fault_hook(recorder)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        published: set[str] = set()
        worker = self._worker(req.queue)
        running = loop.create_task(worker.run())
        try:
            while True:
                state, code = await row_state(self.driver, req.id, req.queue, baseline)
                if state not in _LIVE:
                    break
                if loop.time() > deadline:
                    raise TimeoutError(f"{handle.name} did not settle in {self.timeout_s} s")
                if recorder.killed and worker.stats().in_flight == 0:
                    # The "process" died: its worker is gone; a fresh one takes over after the
                    # killed attempt's lease lapses.
                    await worker.stop()
                    await running
                    recorder.killed = False
                    await self._pass(self.visibility_timeout_ms + 1)
                    worker = self._worker(req.queue)
                    running = loop.create_task(worker.run())
                    continue
                await self._publish_awaited(req.run_id, published)
                if self.clock is not None and worker.stats().in_flight == 0:
                    await self._skip_idle(state)
                await asyncio.sleep(0.002)
        finally:
            await worker.stop()
            await running
            install_fault_hook(None)
        recorder.flush()
        if kill_at is not None and recorder.boundaries <= kill_at:
            raise AssertionError(
                f"{handle.name} never reached boundary #{kill_at} (it has {recorder.boundaries})"
            )
        records = await self.driver.steps.load(req.run_id)
        return RunResult(
            state,
            code,
            tuple(recorder.events),
            frozenset(r.name for r in records if r.once),
        )

    async def _pass(self, ms: int) -> None:
        if self.clock is not None:
            self.clock.advance(ms)
        else:
            await asyncio.sleep(ms / 1000)

    async def _skip_idle(self, state: str) -> None:
        """With nothing running, move the manual clock to when the row is next due."""
        assert self.clock is not None
        if state == str(JobState.RUNNING):
            return
        next_due = getattr(self.driver, "next_due_at", None)
        when = next_due() if callable(next_due) else None
        if when is None:
            self.clock.advance(50)
        elif when > self.clock.now():
            self.clock.set(when)

    async def _publish_awaited(self, run_id: UUID, published: set[str]) -> None:
        """Publish each configured event once its run records a wait for it."""
        if not self.events:
            return
        bus = capability(self.driver, "events")
        if bus is None:
            return
        for record in await self.driver.steps.load(run_id):
            name = record.event
            if (
                record.status == "waiting"
                and name is not None
                and name in self.events
                and name not in published
            ):
                published.add(name)
                payload = self.events[name]
                if isinstance(payload, dict) and record.match:
                    # The wait's own match keys, so the event is this run's.
                    payload = {**payload, **record.match}
                await bus.publish(PublishRequest(name, payload, None, 3_600_000))


_LIVE = frozenset(str(state) for state in LIVE_STATES)


async def queue_counts(driver: JobDriver, queue: str) -> dict[str, int]:
    """Answer ``queue``'s count per state (from ``stats()``)."""
    for row in await driver.stats():
        if row.queue == queue:
            return {state.value: getattr(row, state.value) for state in JobState}
    return {}


async def row_state(
    driver: JobDriver, job_id: UUID, queue: str, baseline: Mapping[str, int]
) -> tuple[str, str | None]:
    """Answer a row's ``(state, last_error_code)``.

    With ``introspect`` the row is read. Without it the run must be the only live row of
    ``queue``: while any row there is live the state is ``running``, and afterwards it is the
    finished state whose count grew since ``baseline`` (the code is then unknown, ``None``).
    """
    introspect = capability(driver, "introspect")
    if introspect is not None:
        info = await introspect.get(job_id)
        if info is None:
            raise AssertionError(f"row {job_id} vanished")
        return (str(info.state), info.last_error_code)
    counts = await queue_counts(driver, queue)
    if any(counts.get(str(state), 0) for state in LIVE_STATES):
        return (str(JobState.RUNNING), None)
    grown = [s for s, n in counts.items() if n > baseline.get(s, 0)]
    if len(grown) != 1:
        raise AssertionError(f"cannot tell how row {job_id} ended from {counts} ({baseline})")
    return (grown[0], None)


async def check_in_process(
    handle: JobHandle[Any, Any], input: Any, runner: InProcessRun
) -> CrashReport:
    """Run ``handle`` cleanly, then killed at each of its boundaries; check every recovery.

    Raises:
        CrashDivergedError: ``X_JOB_CRASH_DIVERGED`` for the first kill that diverged.
    """
    clean = await runner.run(handle, input, None)
    points = kill_points(clean)
    for kill in points:
        crashed = await runner.run(handle, input, kill.index)
        check_recovery(handle.name, clean, crashed, kill)
    return CrashReport(handle.name, (clean.state, clean.code), dict(clean.effects), tuple(points))


async def crash_proof(
    job: JobHandle[Any, Any],
    input: Any,
    *,
    driver: JobDriver | None = None,
    clock: SettableClock | None = None,
    effects: Callable[[], Sequence[Hashable]] | None = None,
    events: Mapping[str, JSONValue] | None = None,
    visibility_timeout: Duration = "1s",
) -> CrashReport:
    """Check that ``job`` survives a crash at every step boundary, in-process.

    The job runs once cleanly on a real worker, then once per step boundary of that run (before
    each step, after its function returned, after its output was persisted; compensators and
    sleeps/waits included), killed exactly there: the attempt is cancelled at the boundary and
    its lease abandoned, and a fresh worker takes the run over once the lease lapses (the clock
    jumps past it). Each recovered run is compared with the clean one by the rules of
    ``90-conformance.md`` (see :mod:`jobs_core._crash`).

    Effects are what is compared, so make them observable: pass ``effects``, a function
    answering every effect your job's side-effecting code recorded so far (e.g. ``lambda:
    sent_emails`` where your test's fake mailer appends to ``sent_emails``). Without it each step
    function's completion counts as its effect, which proves replay never reruns a persisted
    step but cannot see an effect made outside ``step.run``.

    Example::

        sent: list[str] = []


        def send_welcome(org_id: str) -> str:
            sent.append(f"welcome:{org_id}")  # the fake mailer records each email
            return "ok"


        @job(input=Onboard, idempotency_key=lambda i: i.org_id, tenant="none")
        async def onboard(input: Onboard, step: Step, ctx: JobContext) -> None:
            await step.run("welcome", send_welcome, input.org_id)


        async def test_onboard_is_crash_proof() -> None:
            report = await crash_proof(onboard, Onboard(org_id="o1"), effects=lambda: sent)
            assert len(report.kill_points) == 3

    Args:
        job: the job to check.
        input: its input (each run enqueues it again: the clean run finished, so its key is
            free).
        driver: the driver to run on; default a fresh memory driver on a manual clock. A driver
            of your own runs on ``clock`` if you give the one it was built with, else in real
            time (each kill then waits out ``visibility_timeout``).
        clock: the manual clock ``driver`` decides time on.
        effects: answers every effect observed so far, in order (labels compare by ``str``).
        events: payloads to publish, by event name, when the run waits for that event (a dict
            payload gets the wait's ``match`` keys added).
        visibility_timeout: the workers' lease (``"1s"``).

    Returns:
        What was exercised: the clean outcome and effects, and every kill point.

    Raises:
        CrashDivergedError: ``X_JOB_CRASH_DIVERGED`` naming the kill point and the effect (or
            outcome) that diverged; ``meta["kind"]`` is ``extra-effect``, ``missing-effect`` or
            ``outcome``.
        TimeoutError: a run did not settle within a minute.
    """
    owned = driver is None
    if driver is None:
        from jobs_core.drivers.memory import MemoryDriver
        from jobs_core.testing import ManualClock

        clock = ManualClock()
        driver = MemoryDriver(clock)
    registry = JobRegistry()
    registry.register(job)
    runner = InProcessRun(
        driver,
        registry,
        clock,
        parse_duration(visibility_timeout, field="visibility_timeout"),
        dict(events or {}),
        effects,
    )
    try:
        return await check_in_process(job, input, runner)
    finally:
        if owned:
            await driver.close()


__all__ = [
    "CrashReport",
    "InProcessRun",
    "KillPoint",
    "RunResult",
    "SettableClock",
    "SimulatedKill",
    "check_in_process",
    "check_recovery",
    "crash_proof",
    "kill_points",
    "owners",
    "queue_counts",
    "row_state",
]
