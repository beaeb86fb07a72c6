"""What both factories share: their checks, the job they declare, and calling app functions.

Every job a factory declares has one body function of the factory's own, so each is declared
with ``job(declared_at=...)``, the factory's caller's ``(file, line)``
(:func:`jobs_core.job.declaration_site`): two factory calls naming one job collide with
``X_JOB_DUPLICATE``, and the same call made again (a module reload) replaces its own.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel

from jobs_core import JobHandle, JobRegistry, job
from jobs_core.errors import (
    IdempotencyRequiredError,
    JobDeclarationInvalidError,
    TenantRequiredError,
)
from jobs_core.job import declaration_site
from jobs_subject._subject import Subject


def caller_site() -> tuple[str, int]:
    """Answer ``(file, line)`` of the code that called the factory calling this."""
    # declaration_site <- caller_site <- subject_export/subject_erase <- the declaring code
    return declaration_site(skip=1)


def key_reader(input: Any, key: Callable[[Any], Any] | None, problems: list[str]) -> Any:
    """Answer ``key``, or for an input model of exactly one field a reader of that field."""
    if key is not None:
        if not callable(key):
            problems.append("key: must be a function (input) -> the subject's key")
        return key
    fields = getattr(input, "model_fields", None) if isinstance(input, type) else None
    if isinstance(input, type) and issubclass(input, BaseModel) and fields and len(fields) == 1:
        (field,) = fields
        return lambda i: getattr(i, field)
    problems.append(
        "key: required, (input) -> the subject's key (it may be left out only when the input "
        "model has exactly one field)"
    )
    return None


def check_subject(subject: object, problems: list[str]) -> None:
    """Add a problem unless ``subject`` is what :func:`~jobs_subject.define_subject` answers."""
    if not isinstance(subject, Subject):
        problems.append(
            f"subject: must be a define_subject(...) Subject, got {type(subject).__name__}"
        )


def declare(
    kind: str,
    options: dict[str, Any],
    problems: list[str],
    run: Callable[[Any, Any, Any], Awaitable[Any]],
    site: tuple[str, int],
    registry: JobRegistry | None,
) -> JobHandle[Any, Any]:
    """Make the job, or raise every problem of the declaration (the core's included) at once.

    Args:
        kind: the factory's name, for messages.
        options: the :func:`jobs_core.job` keyword arguments (``name``, ``input``, ``tenant``,
            ``idempotency_key``, ``queue``, ``retry``, ``timeout``, ``concurrency``,
            ``on_settled``).
        problems: the factory's own problems (empty when it found none).
        run: what the body runs, ``await run(input, step, ctx)``.
        site: :func:`caller_site` of the factory call.
        registry: the registry to join (default the process-wide one).

    Raises:
        JobDeclarationInvalidError: ``X_JOB_DECLARATION_INVALID`` listing every problem.
        TenantRequiredError: ``X_JOB_TENANT_REQUIRED`` without a tenant.
        IdempotencyRequiredError: ``X_IDEMPOTENCY_REQUIRED`` for a key that is not a function.
        JobDuplicateError: ``X_JOB_DUPLICATE`` when another declaration holds the name.
    """
    name = options["name"]
    if not isinstance(name, str) or not name.strip():
        problems.insert(0, f"name: required, the durable name of this {kind} job")
        options = {**options, "name": kind}

    async def body(input: Any, step: Any, ctx: Any) -> Any:
        return await run(input, step, ctx)

    refused: type[JobDeclarationInvalidError | IdempotencyRequiredError | TenantRequiredError]
    refused = JobDeclarationInvalidError
    try:  # the core's own checks, against a registry nothing else sees
        job(**options, registry=JobRegistry(), declared_at=site)(body)
    except (JobDeclarationInvalidError, IdempotencyRequiredError, TenantRequiredError) as exc:
        refused = type(exc)
        problems = [*exc.meta.get("problems", [exc.message]), *problems]
    if problems:
        raise refused(
            f"{kind} {name!r} is declared wrong: " + "; ".join(problems),
            job=name,
            problems=problems,
        )
    return job(**options, registry=registry, declared_at=site)(body)


async def call(fn: Callable[..., Any], *args: Any) -> Any:
    """Call an app function and answer its result.

    A coroutine function (or one answering an awaitable) is awaited; a plain one runs in a
    worker thread, so a blocking client never stalls the loop.
    """
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - a callable object's own method
    ):
        return await fn(*args)
    result = await asyncio.to_thread(fn, *args)
    if inspect.isawaitable(result):
        return await result
    return result


__all__ = ["call", "caller_site", "check_subject", "declare", "key_reader"]
