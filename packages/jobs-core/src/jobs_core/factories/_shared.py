"""What the factories share: the handle subclass they answer, and calling the app's functions.

A factory declares its job with :func:`jobs_core.job` (so every field is validated and the job
joins the registry like any other) and then answers that handle as a subclass of
:class:`~jobs_core.JobHandle` carrying the factory's own members (``backfill.plan()``,
``consumer.supervisor``). :func:`adopt` builds the subclass from the declared handle and puts it
in the registry in the handle's place. Rejected: a wrapper object holding the handle (as
jobs-webhooks does), because a task's entries and the worker's registry want a ``JobHandle``,
and a handle class parameter on ``job()``, which would widen the core's declaration API for
three callers.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from jobs_core._current import current_driver
from jobs_core._threads import run_in_thread
from jobs_core.job import JobHandle, JobRegistry, job
from jobs_core.retry import Retry

H = TypeVar("H", bound=JobHandle[Any, Any])


def adopt(cls: type[H], handle: JobHandle[Any, Any]) -> H:
    """Answer ``handle`` as an instance of ``cls``, registered in its place.

    ``cls`` is a subclass of :class:`~jobs_core.JobHandle` that adds members only (no
    ``__init__`` of its own): the instance takes the declared handle's attributes as they are.
    """
    made = cls.__new__(cls)
    made.__dict__.update(handle.__dict__)
    # The same declaration site: the registry replaces the plain handle with this one.
    handle.registry.register(made)
    return made


def declare_singleton(
    cls: type[H],
    body: Callable[..., Any],
    *,
    name: str,
    input: Any,
    key: str,
    site: tuple[str, int],
    queue: str,
    retry: Retry | None,
    registry: JobRegistry | None,
) -> H:
    """Declare a job of no tenant with one live run at a time (the constant key ``key``).

    What a sweep, a rollup or a view refresh is: a second enqueue while a pass runs answers it.
    Answers the declared handle as ``cls`` (:func:`adopt`).
    """
    declared = job(
        input=input,
        idempotency_key=lambda _run: key,
        tenant="none",
        retry=retry,
        name=name,
        queue=queue,
        registry=registry,
        declared_at=site,
    )(body)
    return adopt(cls, declared)


async def store_now() -> str:
    """Answer the running driver's store clock, ISO 8601 (a step's output: one reading a pass)."""
    return (await current_driver().steps.now()).isoformat()


async def call(fn: Callable[..., Any], *args: Any) -> Any:
    """Call an app function, sync or async: a plain ``def`` runs on a thread of its own.

    A sync function that answers an awaitable (a lambda around a coroutine function) has it
    awaited here.
    """
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    answer = await run_in_thread(fn, *args)
    if inspect.isawaitable(answer):
        return await answer
    return answer


def is_positive_int(value: object, most: int | None = None) -> bool:
    """Whether ``value`` is an ``int`` (not a ``bool``) of at least 1 (and at most ``most``)."""
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value >= 1
        and (most is None or value <= most)
    )


def arity(fn: Callable[..., Any]) -> int | None:
    """Answer how many positional arguments ``fn`` takes, or ``None`` when it takes any number.

    Used to hand an optional trailing argument (a transaction, a cancel signal) only to the
    functions that ask for it.
    """
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    count = 0
    for param in params:
        if param.kind is param.VAR_POSITIONAL:
            return None
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            count += 1
    return count
