"""The crash-proof harness over real worker subprocesses, SIGKILLed at a step boundary.

The analysis (which effects a recovered run may repeat) is :mod:`jobs_core._crash`'s, shared with
the in-process check behind :func:`jobs_core.testing.crash_proof`; this module only produces the
traces with real processes. A scenario truncates the trace file, enqueues the reference job from
the test process, and starts a worker subprocess (the driver package's ``crash_worker_command``
with ``--visibility-timeout 1s``) armed to SIGKILL itself at boundary ``k``. Whenever no worker is
alive and the row is still live, a fresh unarmed worker starts; it takes the run over when the
killed attempt's lease lapses. Once the row settles the worker is stopped with SIGTERM (a drain).
The trace file then holds, in order, every boundary marker and every effect line of the run.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs_conformance import reference
from jobs_core._crash import RunResult, TraceEvent, queue_counts, row_state
from jobs_core.driver import JobDriver, PublishRequest, capability
from jobs_core.job import JobHandle
from jobs_core.types import LIVE_STATES, EnqueueRequest, JSONValue

APP = "jobs_conformance.reference"
"""The module a worker subprocess imports: it declares the reference jobs and arms the hook."""

VISIBILITY_TIMEOUT = "1s"
"""The lease of every worker subprocess: a killed attempt's run is taken over after it."""

_LIVE = frozenset(str(state) for state in LIVE_STATES)


def parse_trace(text: str) -> tuple[TraceEvent, ...]:
    """Answer a trace file's events: ``@point step`` markers and effect lines."""
    events: list[TraceEvent] = []
    for line in text.splitlines():
        if line.startswith("@"):
            point, _, step = line[1:].partition(" ")
            assert point in ("before", "returned", "persisted"), line
            events.append((point, step))  # type: ignore[arg-type]
        elif line:
            events.append(("effect", line))
    return tuple(events)


@dataclass(slots=True)
class SubprocessRun:
    """Runs reference jobs in worker subprocesses against the driver's backend.

    Attributes:
        driver: the test process's driver over the same backend (enqueues, polls, publishes).
        command: the driver package's ``crash_worker_command``: ``(app) -> argv``.
        workdir: where trace files and worker logs go.
        events: payloads to publish when a run waits (see :data:`reference.EVENTS`).
        timeout_s: real seconds one scenario may take.
        last: the request of the scenario run last (its ids, for a test to read the row).
    """

    driver: JobDriver
    command: Callable[[str], Sequence[str]]
    workdir: Path
    events: Mapping[str, JSONValue]
    timeout_s: float = 90.0
    last: EnqueueRequest | None = None

    def _start(self, trace: Path, kill_at: int | None, n: int) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env[reference.TRACE_ENV] = str(trace)
        env.pop(reference.KILL_ENV, None)
        if kill_at is not None:
            env[reference.KILL_ENV] = str(kill_at)
        argv = [
            *self.command(APP),
            "--visibility-timeout",
            VISIBILITY_TIMEOUT,
            "--concurrency",
            "1",
            "--log-level",
            "warning",
        ]
        log = (self.workdir / f"{trace.stem}.worker{n}.log").open("wb")
        return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)

    async def run(
        self, handle: JobHandle[Any, Any], kill_at: int | None, items: int = 6
    ) -> RunResult:
        """Run one scenario of ``handle``; answer how it ended and its trace.

        Args:
            handle: the reference job.
            kill_at: the boundary to SIGKILL the worker at (``None``: a clean run).
            items: the input's ``items`` (batches of the consumer, children of the fan-out).

        Raises:
            TimeoutError: it did not settle within ``timeout_s``.
        """
        tag = uuid.uuid4().hex[:12]
        trace = self.workdir / f"{handle.name}-{tag}.trace"
        trace.write_text("")
        req = handle.build_request(reference.RefInput(log=str(trace), tag=tag, items=items))
        baseline = await queue_counts(self.driver, req.queue)
        await self.driver.enqueue(req)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        started = 0
        worker = self._start(trace, kill_at, started)
        published: set[str] = set()
        try:
            while True:
                state, code = await row_state(self.driver, req.id, req.queue, baseline)
                if state not in _LIVE:
                    break
                if loop.time() > deadline:
                    raise TimeoutError(f"{handle.name} did not settle in {self.timeout_s} s")
                if worker.poll() is not None:
                    started += 1
                    worker = self._start(trace, None, started)
                await self._publish_awaited(req.run_id, published)
                await asyncio.sleep(0.05)
        finally:
            await _stop(worker)
        self.last = req
        records = await self.driver.steps.load(req.run_id)
        return RunResult(
            state,
            code,
            parse_trace(trace.read_text("utf-8")),
            frozenset(r.name for r in records if r.once),
        )

    async def _publish_awaited(self, run_id: uuid.UUID, published: set[str]) -> None:
        bus = capability(self.driver, "events")
        if bus is None:
            return
        for record in await self.driver.steps.load(run_id):
            name = record.event
            if record.status != "waiting" or name is None or name in published:
                continue
            if name in self.events:
                published.add(name)
                payload = {**self.events[name], **dict(record.match or {})}
                await bus.publish(PublishRequest(name, payload, None, 3_600_000))


async def _stop(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(worker.wait, 15)
        except subprocess.TimeoutExpired:
            worker.kill()
            await asyncio.to_thread(worker.wait)
