"""Named fault points at every step boundary, for crash-proof tests.

The step runner announces three boundaries of every step it runs (compensators and parking steps
included): ``before`` (nothing of the step has happened), ``returned`` (its function returned and
its output is not yet persisted) and ``persisted`` (its record landed). A test installs a hook that
raises, cancels, or SIGKILLs its own process at a chosen boundary, then checks recovery by
counting effects (``90-conformance.md``). With no hook installed a boundary costs one global read
(:func:`hooked`).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal
from uuid import UUID

FaultPoint = Literal["before", "returned", "persisted"]
"""A step boundary."""


@dataclass(frozen=True, slots=True)
class Boundary:
    """One step boundary as a hook sees it.

    Attributes:
        point: ``before``, ``returned`` or ``persisted``.
        job: the job name.
        run_id: the run.
        step: the step name (``compensate:<name>`` for a compensator).
    """

    point: FaultPoint
    job: str
    run_id: UUID
    step: str


FaultHook = Callable[[Boundary], Awaitable[None] | None]
"""A hook called at every boundary; it may raise (or kill the process) to inject a fault."""

_hook: FaultHook | None = None


def install_fault_hook(hook: FaultHook | None) -> None:
    """Install ``hook`` process-wide (``None`` removes it)."""
    global _hook
    _hook = hook


def hooked() -> bool:
    """Answer whether a hook is installed (callers skip building a boundary when none is)."""
    return _hook is not None


async def boundary(point: FaultPoint, job: str, run_id: UUID, step: str) -> None:
    """Announce a boundary to the installed hook, if any."""
    hook = _hook
    if hook is None:
        return
    result = hook(Boundary(point, job, run_id, step))
    if inspect.isawaitable(result):
        await result
