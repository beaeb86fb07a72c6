"""What both factories share: checking a declaration all at once, and making the job.

A factory checks its own fields, then hands the rest to :func:`jobs_core.job`. So that a user sees
every problem in one error (the core's rule for declarations), a factory with problems of its own
first runs the core's checks against a throwaway registry and merges the two lists into one
error, of the core's class when the core found something (``X_JOB_TENANT_REQUIRED`` for a missing
tenant), else ``X_JOB_DECLARATION_INVALID``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from jobs_core import JobHandle, JobRegistry, Retry, Settled, job
from jobs_core.errors import (
    IdempotencyRequiredError,
    JobDeclarationInvalidError,
    TenantRequiredError,
)
from jobs_core.job import declaration_site
from jobs_core.limits import Concurrency

Format = Literal["csv", "ndjson"]
FORMATS: tuple[Format, ...] = ("csv", "ndjson")


@dataclass(frozen=True, slots=True)
class JobOptions:
    """The :func:`jobs_core.job` options a factory passes through unchanged."""

    name: Any
    input: Any
    tenant: Any
    idempotency_key: Callable[[Any], str]
    queue: str
    retry: Retry | None
    timeout: Any
    concurrency: int | Concurrency | None
    on_settled: Callable[[Settled], Any] | None
    registry: JobRegistry | None


def check_callable(problems: list[str], field: str, value: object, shape: str) -> None:
    """Add a problem unless ``value`` is callable (``shape`` says what it should look like)."""
    if not callable(value):
        problems.append(f"{field}: required, a function {shape}")


def check_int(problems: list[str], field: str, value: object, *, minimum: int) -> bool:
    """Add a problem unless ``value`` is an ``int >= minimum`` (not a bool); answer whether ok."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        problems.append(f"{field}: must be an int >= {minimum}, got {value!r}")
        return False
    return True


def check_columns(problems: list[str], columns: object) -> list[str]:
    """Answer ``columns`` as a list when it is a non-empty sequence of unique non-empty names."""
    if isinstance(columns, str) or not isinstance(columns, Sequence) or not columns:
        problems.append("columns: required, a non-empty list of column names")
        return []
    names = list(columns)
    if not all(isinstance(name, str) and name for name in names):
        problems.append("columns: every column name must be non-empty text")
        return []
    if len(set(names)) != len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        problems.append(f"columns: {twice} named more than once")
        return []
    return names


def check_format(problems: list[str], format: object) -> None:
    """Add a problem unless ``format`` is ``"csv"`` or ``"ndjson"``."""
    if format not in FORMATS:
        problems.append(f"format: must be 'csv' or 'ndjson', got {format!r}")


def caller_site() -> tuple[str, int]:
    """Answer ``(file, line)`` of the code that called the factory calling this.

    What :func:`jobs_core.job` takes as ``declared_at``: the registry tells a module reload (the
    same call site again) from a second job taking a name (``X_JOB_DUPLICATE``) by it, since every
    factory body shares one code location.
    """
    # declaration_site <- caller_site <- export_rows/import_rows <- the declaring code
    return declaration_site(skip=1)


def declare(
    kind: str,
    options: JobOptions,
    problems: list[str],
    run: Callable[[Any, Any, Any], Awaitable[Any]],
    site: tuple[str, int],
) -> JobHandle[Any, Any]:
    """Make the job, or raise every problem of the declaration at once.

    Args:
        kind: the factory's name (``"export_rows"``), for messages.
        options: what goes to :func:`jobs_core.job`.
        problems: the factory's own problems (empty when it found none).
        run: what the job body runs, ``await run(input, step, ctx)``.
        site: :func:`caller_site` of the factory call.

    Raises:
        JobDeclarationInvalidError: ``X_JOB_DECLARATION_INVALID`` listing every problem.
        TenantRequiredError: ``X_JOB_TENANT_REQUIRED`` when the tenant is missing.
        IdempotencyRequiredError: ``X_IDEMPOTENCY_REQUIRED`` (the factories default the key,
            so only for a key that is not a function).
        JobDuplicateError: ``X_JOB_DUPLICATE`` when another declaration holds the name.
    """
    if not isinstance(options.name, str) or not options.name.strip():
        problems.insert(0, f"name: required, the durable name of this {kind} job")

    async def body(input: Any, step: Any, ctx: Any) -> Any:
        return await run(input, step, ctx)

    arguments: dict[str, Any] = {
        "name": options.name if isinstance(options.name, str) and options.name.strip() else kind,
        "input": options.input,
        "tenant": options.tenant,
        "idempotency_key": options.idempotency_key,
        "queue": options.queue,
        "retry": options.retry,
        "timeout": options.timeout,
        "concurrency": options.concurrency,
        "on_settled": options.on_settled,
    }
    core_errors = (JobDeclarationInvalidError, IdempotencyRequiredError, TenantRequiredError)
    if problems:
        error_type: type[
            JobDeclarationInvalidError | IdempotencyRequiredError | TenantRequiredError
        ] = JobDeclarationInvalidError
        found = list(problems)
        try:
            job(**arguments, registry=JobRegistry())(body)
        except core_errors as exc:
            error_type = type(exc)
            found = list(exc.meta.get("problems", [exc.message])) + found
        raise error_type(
            f"{kind} {options.name!r} is declared wrong: " + "; ".join(found),
            job=options.name,
            problems=found,
        )
    return job(**arguments, registry=options.registry, declared_at=site)(body)


def is_async(fn: Callable[..., Any]) -> bool:
    """Answer whether calling ``fn`` answers a coroutine (a coroutine function or object)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - a callable object's own method
    )


def call_from_thread(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> Any:
    """Call an app function from a worker thread and answer its result.

    A coroutine function, or a plain function answering an awaitable (``lambda rows, i:
    upsert(rows)`` over an async ``upsert``), is awaited on ``loop`` (the worker's) while this
    thread waits; the coroutine runs in this thread's context, so the job's tenant is ambient.

    Args:
        loop: the running loop of the job's attempt.
        fn: the app's function.
        *args: its arguments.
    """
    if is_async(fn):
        return asyncio.run_coroutine_threadsafe(fn(*args), loop).result()
    result = fn(*args)
    if inspect.isawaitable(result):
        return asyncio.run_coroutine_threadsafe(_awaited(result), loop).result()
    return result


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


__all__ = [
    "FORMATS",
    "Format",
    "JobOptions",
    "call_from_thread",
    "caller_site",
    "check_callable",
    "check_columns",
    "check_format",
    "check_int",
    "declare",
    "is_async",
]
