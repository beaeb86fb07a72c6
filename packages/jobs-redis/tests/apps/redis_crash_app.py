"""A worker app for SIGKILL crash tests: a three-step job (and a once step) logging its effects.

``JOBS_TEST_KILL`` = ``<point>:<step>`` makes this process SIGKILL itself when the step runner
reaches that boundary (``before``, ``returned`` or ``persisted``), once: a marker file keeps the
next worker from dying too. Effects append one line per step function call to
``JOBS_TEST_EFFECTS``, a file outside the queue.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from jobs_core import Retry, job
from jobs_core.faults import Boundary, install_fault_hook

_EFFECTS = Path(os.environ["JOBS_TEST_EFFECTS"])
_KILL = os.environ.get("JOBS_TEST_KILL", "")
_KILLED = _EFFECTS.with_suffix(".killed")


class Order(BaseModel):
    key: str


def _effect(step: str) -> str:
    with _EFFECTS.open("a") as out:
        out.write(step + "\n")
        out.flush()
        os.fsync(out.fileno())
    return step


def _hook(at: Boundary) -> None:
    if f"{at.point}:{at.step}" == _KILL and not _KILLED.exists():
        _KILLED.write_text("killed")
        os.kill(os.getpid(), signal.SIGKILL)


install_fault_hook(_hook)


@job(
    input=Order,
    idempotency_key=lambda o: o.key,
    tenant="none",
    name="crash.three",
    retry=Retry(attempts=4, delay="50ms"),
)
async def three(order: Order, step: Any, ctx: Any) -> str:
    await step.run("charge", _effect, "charge")
    await step.run("ship", _effect, "ship")
    await step.run("notify", _effect, "notify")
    return "ok"


@job(
    input=Order,
    idempotency_key=lambda o: o.key,
    tenant="none",
    name="crash.once",
    retry=Retry(attempts=4, delay="50ms"),
)
async def once(order: Order, step: Any, ctx: Any) -> str:
    await step.run("pay", _effect, "pay", once=True)
    return "ok"
