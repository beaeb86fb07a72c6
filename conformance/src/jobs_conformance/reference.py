"""Reference jobs for the crash-proof tests, and the fault hook a worker subprocess arms.

Every effect a reference job has appends one line to an effects log outside the queue: the file
named by its input's ``log``. Steps only, steps around a sleep, steps around an event wait, a
compensating job that fails for good, a ``once`` step, and a consumer that works through items in
batches with a cursor; each is crash-proof, so every kill must recover exactly as
:mod:`jobs_core._crash` says. ``conformance.ref.leaky`` is not: it has an effect outside a step,
which the harness must flag ``X_JOB_CRASH_DIVERGED``.

A worker subprocess started as ``jobsctl worker jobs_conformance.reference ...`` with
``JOBS_CONFORMANCE_TRACE`` set appends a marker line (``@<point> <step>``) to that file at every
step boundary of a reference job, and with ``JOBS_CONFORMANCE_KILL_AT=k`` SIGKILLs itself right
after writing the marker of the scenario's boundary number ``k`` (counted over the whole file, so
over every process that worked on the run).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from jobs_core import JobContext, Retry, Step, classify, job
from jobs_core.faults import Boundary, install_fault_hook

TRACE_ENV = "JOBS_CONFORMANCE_TRACE"
"""The environment variable naming the trace file a worker subprocess writes markers to."""

KILL_ENV = "JOBS_CONFORMANCE_KILL_AT"
"""The environment variable naming the boundary a worker subprocess SIGKILLs itself at."""

QUEUE = "conformance-crash"
"""The queue every reference job runs on."""

PREFIX = "conformance.ref."
"""The name prefix of every reference job."""

PAID_EVENT = "conformance.ref.paid"
"""The event ``conformance.ref.wait`` waits for (its match is ``{"tag": input.tag}``)."""

DECLINED = "X_CONFORMANCE_DECLINED"
"""The terminal error code ``conformance.ref.saga``'s last step fails with."""

classify({DECLINED: "terminal"})


class RefInput(BaseModel):
    """A reference job's input.

    Attributes:
        log: the effects log (a file path).
        tag: unique per run, so each run has its own idempotency key and event match.
        items: how many items ``conformance.ref.batch`` works through.
    """

    log: str
    tag: str
    items: int = 6


class Paid(BaseModel):
    """The event ``conformance.ref.wait`` waits for."""

    tag: str
    amount: int = 0


class Declined(Exception):
    """The payment provider's final refusal (terminal)."""

    code = DECLINED


def effect(log: str, label: str) -> None:
    """Append one effect line to the log (one write, so a kill never leaves half a line)."""
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"{label}\n")


def effects_of(log: str) -> list[str]:
    """Answer the effect lines of a log, in order (boundary markers left out)."""
    path = Path(log)
    if not path.exists():
        return []
    return [line for line in path.read_text("utf-8").splitlines() if not line.startswith("@")]


def _acts(label: str) -> Callable[[str], dict[str, str]]:
    def act(log: str) -> dict[str, str]:
        effect(log, label)
        return {"log": log, "did": label}

    act.__name__ = label
    return act


def _undo(label: str) -> Callable[[dict[str, str]], None]:
    def undo(output: dict[str, str]) -> None:
        effect(output["log"], label)

    undo.__name__ = label
    return undo


def _declare(name: str, **options: Any) -> Callable[[Callable[..., Any]], Any]:
    return job(
        input=RefInput,
        idempotency_key=lambda i: f"{name}:{i.tag}",
        tenant="none",
        name=PREFIX + name,
        queue=QUEUE,
        retry=options.pop("retry", Retry(attempts=3, delay="100ms")),
        **options,
    )


@_declare("steps")
async def steps_only(input: RefInput, step: Step, ctx: JobContext) -> str:
    """Three steps, each with one effect."""
    await step.run("a", _acts("a"), input.log)
    await step.run("b", _acts("b"), input.log)
    await step.run("c", _acts("c"), input.log)
    return "done"


@_declare("sleep")
async def steps_and_sleep(input: RefInput, step: Step, ctx: JobContext) -> str:
    """A step, a short sleep (the run parks), a step."""
    await step.run("a", _acts("a"), input.log)
    await step.sleep("nap", "300ms")
    await step.run("b", _acts("b"), input.log)
    return "rested"


@_declare("wait", event_poll="30s")
async def steps_and_wait(input: RefInput, step: Step, ctx: JobContext) -> int:
    """A step, a wait for this run's payment event, a step using its payload."""
    await step.run("a", _acts("a"), input.log)
    paid = await step.wait_for_event(
        "paid", PAID_EVENT, schema=Paid, match={"tag": input.tag}, timeout="1h", required=True
    )
    await step.run("b", _acts(f"b:{paid.amount}"), input.log)
    return int(paid.amount)


def _ship(log: str) -> None:
    raise Declined("the carrier refused the parcel")


@_declare("saga", compensates=True, retry=Retry(attempts=2, delay="100ms"))
async def saga(input: RefInput, step: Step, ctx: JobContext) -> None:
    """Two compensated steps, then a step that fails for good: both are compensated."""
    await step.run("reserve", _acts("reserve"), input.log, compensate=_undo("release"))
    await step.run("charge", _acts("charge"), input.log, compensate=_undo("refund"))
    await step.run("ship", _ship, input.log)


@_declare("once")
async def once_step(input: RefInput, step: Step, ctx: JobContext) -> str:
    """A step, an at-most-once step, a step."""
    await step.run("a", _acts("a"), input.log)
    await step.run("charge", _acts("charge"), input.log, once=True)
    await step.run("c", _acts("c"), input.log)
    return "charged"


def _consume(log: str, cursor: int, items: int) -> int | None:
    end = min(cursor + 2, items)
    for item in range(cursor, end):
        effect(log, f"item:{item}")
    return end if end < items else None


@_declare("batch")
async def batch_consumer(input: RefInput, step: Step, ctx: JobContext) -> int:
    """A consumer: each step handles the next two items and answers the cursor after them."""
    cursor: int | None = 0
    batches = 0
    while cursor is not None:
        cursor = await step.run(f"batch:{batches}", _consume, input.log, cursor, input.items)
        batches += 1
    return batches


class Addend(BaseModel):
    """A child of ``conformance.ref.fanout``: its number, answered after one effect."""

    log: str
    tag: str
    n: int


def _counted(log: str, n: int) -> int:
    effect(log, f"child:{n}")
    return n


@job(
    input=Addend,
    idempotency_key=lambda i: f"{i.tag}:{i.n}",
    tenant="none",
    # Not under PREFIX: the trace marks (and the kills land at) the parent's boundaries only.
    name="conformance.kid.addend",
    queue=QUEUE,
    retry=Retry(attempts=3, delay="100ms"),
)
async def addend(input: Addend, step: Step, ctx: JobContext) -> int:
    """One child: a step with one effect (``child:<n>``) answering ``n``."""
    return int(await step.run("count", _counted, input.log, input.n))


@_declare("fanout", event_poll="1h")
async def fan_out(input: RefInput, step: Step, ctx: JobContext) -> int:
    """A step, ``input.items`` children gathered (the run parks), a step recording their sum.

    ``event_poll="1h"``: only the children's settle events wake the parked run in time.
    """
    await step.run("plan", _acts("plan"), input.log)
    calls = [(addend, Addend(log=input.log, tag=input.tag, n=n)) for n in range(input.items)]
    values = await step.gather("children", calls)
    total = sum(int(str(v)) for v in values)
    await step.run("sum", _acts(f"sum:{total}"), input.log)
    return total


CHILDREN = {"fanout": (addend,)}
"""The child jobs each reference job starts (a worker must know them too)."""

FAN_OUT_BOUNDARIES = 10
"""Step boundaries of a clean ``conformance.ref.fanout`` run: 3 + 2 (enqueue, park) + 2 (the
gathered results written) + 3."""


@_declare("leaky")
async def leaky(input: RefInput, step: Step, ctx: JobContext) -> None:
    """NOT crash-proof: an effect outside any step repeats on every replay after a crash."""
    effect(input.log, "audit")
    await step.run("a", _acts("a"), input.log)
    await step.run("b", _acts("b"), input.log)


CRASH_PROOF = {
    "steps": (steps_only, 9),
    "sleep": (steps_and_sleep, 10),
    "wait": (steps_and_wait, 10),
    "saga": (saga, 13),
    "once": (once_step, 9),
    "batch": (batch_consumer, 9),
}
"""Each crash-proof reference job, with how many step boundaries its clean run has."""

EVENTS = {PAID_EVENT: {"amount": 42}}
"""Payloads the harness publishes when a run waits (the wait's match keys are added)."""


class FileTrace:
    """The fault hook of a worker subprocess: markers to the trace file, SIGKILL at one.

    Args:
        trace: the trace file (also the reference jobs' effects log).
        kill_at: the boundary index to die at, or ``None``.
    """

    def __init__(self, trace: str, kill_at: int | None) -> None:
        self.trace = trace
        self.kill_at = kill_at

    def __call__(self, at: Boundary) -> None:
        """Write the boundary's marker; die if it is the chosen one."""
        if not at.job.startswith(PREFIX):
            return
        with open(self.trace, "a", encoding="utf-8") as out:
            out.write(f"@{at.point} {at.step}\n")
        if self.kill_at is None:
            return
        markers = sum(
            1 for line in Path(self.trace).read_text("utf-8").splitlines() if line[:1] == "@"
        )
        if markers - 1 == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


def _arm_from_environment() -> None:
    trace = os.environ.get(TRACE_ENV)
    if trace:
        kill = os.environ.get(KILL_ENV)
        install_fault_hook(FileTrace(trace, int(kill) if kill else None))


_arm_from_environment()
