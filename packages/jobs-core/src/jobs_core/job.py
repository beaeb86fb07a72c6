"""Declaring jobs: :func:`job` and the handle it answers.

Every declaration problem is raised at declaration (import time), all at once, so a bad job never
reaches a worker. The handle enqueues through the installed driver with the idempotency and
tenant rules of ``10-core.md`` §1 applied before anything is written.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, Literal, TypeVar, cast
from uuid import UUID

from pydantic import TypeAdapter, ValidationError

from jobs_core._current import current_driver, run_sync
from jobs_core._durations import Duration, duration_problem, parse_duration
from jobs_core._inputs import check_texts, issue_text, round_trips, stored_input
from jobs_core._tracing import current_traceparent
from jobs_core.debounce import debounce_options
from jobs_core.errors import (
    EnqueueBatchTooLargeError,
    IdempotencyRequiredError,
    JobDeclarationInvalidError,
    JobDuplicateError,
    JobInputInvalidError,
    JobOptionsInvalidError,
    TenantMismatchError,
    TenantRequiredError,
)
from jobs_core.ids import new_id
from jobs_core.limits import Concurrency
from jobs_core.outbox import submit_many, submit_one
from jobs_core.priority import DEFAULT_PRIORITY, check_priority, priority_problem
from jobs_core.rate import Rate
from jobs_core.retry import Retry
from jobs_core.tenancy import Actor, crossing_reason, current_actor
from jobs_core.types import (
    MAX_ENQUEUE_BATCH,
    ON_SETTLED_TIMEOUT_MS,
    UNWIND_MARGIN,
    EnqueueRequest,
    EnqueueResult,
    JSONValue,
    OnConflict,
)

I = TypeVar("I")  # noqa: E741 - the input type, named as in the spec's tables
R = TypeVar("R")

RESERVED_STEP_NAMES = frozenset({"unwinding"})
"""Step names a body may not use (``compensate:*`` is reserved too)."""

_MISSING: Any = object()

_NUL = "\x00"
"""PostgreSQL text and jsonb cannot hold U+0000, so every driver refuses it alike (C22)."""

INPUT_KEY = "input"
"""``idempotency_key="input"``: the key is :func:`input_key` of the stored input."""

BODY_ARGUMENTS = ("input", "step", "ctx")
"""What a worker hands a body, in this order; a body takes any of them (see :func:`job`)."""


@dataclass(frozen=True, slots=True)
class Settled:
    """What an ``on_settled`` hook is told, once per ending.

    Attributes:
        job_id: the row's id.
        run_id: the run's id.
        name: the job name.
        outcome: ``completed``, ``dead-lettered``, ``dropped`` or ``refused``.
        input: the parsed input, or ``None`` when it did not parse.
        result: the body's return value (``completed`` only).
        error: the failure's message (other outcomes).
        code: the failure's ``X_…`` code, if any.
    """

    job_id: UUID
    run_id: UUID
    name: str
    outcome: Literal["completed", "dead-lettered", "dropped", "refused"]
    input: Any
    result: Any = None
    error: str | None = None
    code: str | None = None


class JobRegistry:
    """The jobs this process knows, by durable name."""

    def __init__(self) -> None:
        """Create an empty registry."""
        self._jobs: dict[str, JobHandle[Any, Any]] = {}

    def register(self, handle: JobHandle[Any, Any]) -> None:
        """Add ``handle``.

        Re-declaring from the same place replaces the old handle, as a module reload does: the
        same function (module, qualified name, file and line), or for a job a factory declared,
        the same call site of the factory (:func:`declaration_site`).

        Raises:
            JobDuplicateError: ``X_JOB_DUPLICATE`` when another declaration holds the name.
        """
        existing = self._jobs.get(handle.name)
        if existing is not None and existing.origin != handle.origin:
            raise JobDuplicateError(
                f"two jobs are named {handle.name!r}: {existing.origin[0]} and "
                f"{handle.origin[0]}; give one of them another name=",
                name=handle.name,
            )
        self._jobs[handle.name] = handle

    def unregister(self, name: str) -> None:
        """Forget the job named ``name`` (no-op if unknown)."""
        self._jobs.pop(name, None)

    def get(self, name: str) -> JobHandle[Any, Any] | None:
        """Answer the job named ``name``, or ``None``."""
        return self._jobs.get(name)

    def all(self) -> list[JobHandle[Any, Any]]:
        """Answer every job, sorted by name."""
        return [self._jobs[name] for name in sorted(self._jobs)]


REGISTRY = JobRegistry()
"""The process-wide registry every :func:`job` declaration joins."""


def _origin(fn: Callable[..., Any]) -> tuple[str, str, int]:
    code = getattr(fn, "__code__", None)
    where = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
    return (where, code.co_filename if code else "", code.co_firstlineno if code else 0)


def declaration_site(skip: int = 0) -> tuple[str, int]:
    """Answer ``(file, line)`` of the code that called the function calling this one.

    A factory over :func:`job` declares every job it makes with one body of its own, so the
    body's source location cannot tell a module reload (the same declaration made again, which
    replaces the old handle) from a second job of the same name (``X_JOB_DUPLICATE``). The
    factory calls this first thing and passes the answer as ``job(declared_at=...)``: the site
    that counts is where the app called the factory.

    Args:
        skip: further frames to skip, for a factory that calls this from a helper of its own.
    """
    frame = sys._getframe(2 + skip)
    return (frame.f_code.co_filename, frame.f_lineno)


class JobHandle(Generic[I, R]):
    """A declared job: call it like its body, enqueue it, describe it.

    Built by :func:`job`; the attributes mirror the declaration (durations in milliseconds).
    ``job(rate=...)`` is kept as :attr:`rate_limit` (a factory's handle may use ``rate`` for a
    throttle of its own, as :class:`~jobs_core.factories.backfill.BackfillJob` does).
    """

    def __init__(
        self,
        body: Callable[..., Any],
        *,
        name: str,
        queue: str,
        input_type: Any,
        idempotency_key: Callable[[I], str] | Literal["input"],
        tenant: Callable[[I], str] | Literal["none"],
        retry: Retry,
        concurrency: int | Concurrency | None,
        timeout_ms: int | None,
        step_timeout_ms: int | None,
        event_poll_ms: int | None,
        compensates: bool,
        on_settled: Callable[[Settled], Any] | None,
        on_settled_timeout_ms: int,
        registry: JobRegistry,
        declared_at: tuple[str, int] | None = None,
        priority: int = DEFAULT_PRIORITY,
        rate: Rate | None = None,
    ) -> None:
        """Hold a validated declaration (use :func:`job`, which validates).

        ``body`` is the declared function; :attr:`body` becomes what a worker calls with
        ``(input, step, ctx)``: that function itself when it takes those three positionally,
        else a thin adapter that passes only what it asks for.
        """
        self.function = body
        self.body: Callable[[Any, Any, Any], Any] = _adapt_body(body)
        # Where the declaration was made: the registry tells a reload from a duplicate by it.
        self.origin = (
            _origin(body)
            if declared_at is None
            else (f"{declared_at[0]}:{declared_at[1]}", declared_at[0], declared_at[1])
        )
        self.name = name
        self.queue = queue
        self.input_type = input_type
        self.adapter: TypeAdapter[I] = TypeAdapter(input_type)
        # Whether the stored form needs proving at each enqueue (see jobs_core._inputs).
        self._prove_inputs = not round_trips(self.adapter.core_schema)
        self.idempotency_key = idempotency_key
        self.tenant = tenant
        self.retry = retry
        self.concurrency = concurrency
        self.rate_limit = rate
        self.timeout_ms = timeout_ms
        self.step_timeout_ms = step_timeout_ms
        self.event_poll_ms = event_poll_ms
        self.compensates = compensates
        self.on_settled = on_settled
        self.on_settled_timeout_ms = on_settled_timeout_ms
        self.priority = priority
        self.is_async = inspect.iscoroutinefunction(body)
        self.registry = registry
        functools.update_wrapper(self, body)

    def __call__(self, input: I, step: Any, ctx: Any) -> Any:
        """Call the body directly (no step persistence; prefer :meth:`run_inline` in tests)."""
        return self.body(input, step, ctx)

    def __repr__(self) -> str:
        """Show the job's name and queue."""
        return f"<job {self.name} queue={self.queue}>"

    @property
    def max_attempts(self) -> int:
        """Attempts a row of this job may use: ``retry.attempts`` (+2 when it compensates)."""
        return self.retry.attempts + (UNWIND_MARGIN if self.compensates else 0)

    def parse_input(self, value: JSONValue) -> I:
        """Validate a stored or given input into the declared type.

        Raises:
            JobInputInvalidError: ``X_JOB_INPUT_INVALID`` with the validation issues (never the
                payload) in ``meta["issues"]``.
        """
        try:
            # By field name too: the stored form names fields, not their aliases, so a field
            # with an alias comes back (a body once got the default instead of its value).
            return self.adapter.validate_python(value, by_alias=True, by_name=True)
        except ValidationError as exc:
            issues = exc.errors(include_url=False, include_input=False, include_context=False)
            raise JobInputInvalidError(
                f"input of {self.name} does not validate: {issue_text(issues)}",
                job=self.name,
                issues=[{"loc": list(i["loc"]), "msg": i["msg"]} for i in issues],
            ) from None

    def tenant_of(self, input: I) -> str | None:
        """Answer the tenant ``input`` belongs to (``None`` for ``tenant="none"``).

        Raises:
            TenantRequiredError: ``X_JOB_TENANT_REQUIRED`` when the function answers nothing.
        """
        if self.tenant == "none":
            return None
        value = self.tenant(input)
        if value is None or str(value) == "":
            raise TenantRequiredError(f"tenant(input) of {self.name} answered an empty tenant")
        if _NUL in str(value):
            raise TenantRequiredError(
                f"tenant(input) of {self.name} answered text containing U+0000 (NUL), which no "
                "driver stores"
            )
        return str(value)

    def build_request(
        self,
        input: I | JSONValue,
        *,
        run_at: datetime | None = None,
        delay: Duration | None = None,
        queue: str | None = None,
        tenant_id: str | None = None,
        run_id: UUID | None = None,
        actor: Actor | None = None,
        job_id: UUID | None = None,
        order_key: str | None = None,
        priority: int | None = None,
        debounce: Duration | None = None,
        debounce_max: Duration | None = None,
    ) -> EnqueueRequest:
        """Validate one enqueue and answer the request a driver receives; writes nothing.

        Args:
            input: the input (an instance of the declared type or anything it validates from).
            run_at: run no earlier than this aware instant (past instants run now).
            delay: run no earlier than now plus this (``>= 0``); exclusive with ``run_at``.
            queue: override the declared queue.
            tenant_id: state the tenant explicitly (must agree with ``tenant(input)``).
            run_id: name the run instead of minting one.
            actor: the actor of :meth:`enqueue_as`.
            job_id: the job id to use (the outbox allocates it at stage time).
            order_key: the outbox lane (see :meth:`enqueue`).
            priority: override the declared priority (see :mod:`jobs_core.priority`).
            debounce: debounce window (see :meth:`enqueue`); exclusive with ``run_at``/``delay``.
            debounce_max: cap on a debounced row's total wait (needs ``debounce``).

        Raises:
            JobInputInvalidError: ``X_JOB_INPUT_INVALID``.
            IdempotencyRequiredError: ``X_IDEMPOTENCY_REQUIRED`` for an empty key.
            TenantMismatchError: ``X_JOB_TENANT_MISMATCH``.
            JobOptionsInvalidError: ``X_JOB_OPTIONS_INVALID`` naming the bad option.
        """
        parsed = self.parse_input(input)
        stored = stored_input(self.adapter, parsed, self.name, prove=self._prove_inputs)
        if isinstance(self.idempotency_key, str):
            key = input_key(stored)
        else:
            key = self.idempotency_key(parsed)
        if not isinstance(key, str) or not key or _NUL in key:
            raise IdempotencyRequiredError(
                f"idempotency_key(input) of {self.name} answered "
                f"{_key_shape(key)}; "
                "it must be non-empty text without NUL (FIELD-FAILURES C22: no driver stores it)",
                job=self.name,
            )
        declared = self.tenant_of(parsed)
        row_tenant = self._check_tenant(declared, tenant_id, actor)
        ambient = current_actor()
        enqueued_by = actor.id if actor is not None else (ambient.id if ambient else None)
        if isinstance(enqueued_by, str) and _NUL in enqueued_by:
            raise JobOptionsInvalidError(
                "actor: the actor's id contains U+0000 (NUL), which no driver stores",
                option="actor",
            )
        delay_ms, run_at = _timing(run_at, delay)
        row_priority = self.priority if priority is None else check_priority(priority)
        debounce_ms, debounce_max_ms = debounce_options(debounce, debounce_max)
        if debounce_ms is not None and (run_at is not None or delay_ms):
            raise JobOptionsInvalidError(
                "debounce: exclusive with run_at and delay (a debounced row runs debounce after "
                "the last enqueue)",
                option="debounce",
            )
        target_queue = self.queue if queue is None else queue
        if not isinstance(target_queue, str) or not target_queue.strip() or _NUL in target_queue:
            raise JobOptionsInvalidError(
                "queue: must be non-empty text without U+0000 (NUL)", option="queue"
            )
        if order_key is not None and (
            not isinstance(order_key, str) or not order_key or _NUL in order_key
        ):
            raise JobOptionsInvalidError(
                "order_key: non-empty text without U+0000 (NUL) naming the outbox lane",
                option="order_key",
            )
        # NUL was refused above; a lone surrogate is what is left, only past ASCII.
        texts = f"{key}{row_tenant or ''}{enqueued_by or ''}{target_queue}{order_key or ''}"
        if not texts.isascii():
            check_texts(
                self.name,
                (
                    ("idempotency_key", key),
                    ("tenant_id", row_tenant),
                    ("enqueued_by", enqueued_by),
                    ("queue", target_queue),
                    ("order_key", order_key),
                ),
            )
        if run_id is not None and not isinstance(run_id, UUID):
            raise JobOptionsInvalidError("run_id: must be a UUID", option="run_id")
        return EnqueueRequest(
            name=self.name,
            queue=target_queue,
            input=stored,
            idempotency_key=key,
            tenant_id=row_tenant,
            max_attempts=self.max_attempts,
            id=job_id or new_id(),
            run_id=run_id or new_id(),
            run_at=run_at,
            delay_ms=delay_ms,
            # The enqueuing span, when OpenTelemetry is installed: the attempt's span is its child.
            traceparent=current_traceparent(),
            enqueued_by=enqueued_by,
            order_key=order_key,
            priority=row_priority,
            debounce_ms=debounce_ms,
            debounce_max_ms=debounce_max_ms,
        )

    def _check_tenant(
        self, declared: str | None, explicit: str | None, actor: Actor | None
    ) -> str | None:
        if explicit is not None and (
            not isinstance(explicit, str) or not explicit or _NUL in explicit
        ):
            raise JobOptionsInvalidError(
                "tenant_id: must be non-empty text without U+0000 (NUL)", option="tenant_id"
            )
        if actor is not None and isinstance(actor.org_id, str) and _NUL in actor.org_id:
            raise JobOptionsInvalidError(
                "actor: the actor's org_id contains U+0000 (NUL), which no driver stores",
                option="actor",
            )
        as_org = actor.org_id if actor is not None else None
        if declared is None:
            return explicit or as_org
        if explicit is not None and explicit != declared:
            raise TenantMismatchError(
                f"{self.name}: tenant_id={explicit!r} but the input belongs to {declared!r}",
                job=self.name,
                form="explicit",
            )
        if as_org is not None and as_org != declared:
            raise TenantMismatchError(
                f"{self.name}: enqueue_as an actor of {as_org!r} but the input belongs to "
                f"{declared!r}",
                job=self.name,
                form="enqueue_as",
            )
        ambient = current_actor()
        if (
            actor is None
            and ambient is not None
            and ambient.org_id is not None
            and ambient.org_id != declared
            and crossing_reason() is None
        ):
            raise TenantMismatchError(
                f"{self.name}: the ambient actor acts for {ambient.org_id!r} but the input "
                f"belongs to {declared!r}; wrap a deliberate crossing in cross_tenant('why')",
                job=self.name,
                form="ambient",
            )
        return declared

    async def enqueue(
        self,
        input: I | JSONValue,
        *,
        run_at: datetime | None = None,
        delay: Duration | None = None,
        queue: str | None = None,
        tenant_id: str | None = None,
        run_id: UUID | None = None,
        on_conflict: OnConflict = "dedupe",
        outbox: Any = None,
        order_key: str | None = None,
        priority: int | None = None,
        debounce: Duration | None = None,
        debounce_max: Duration | None = None,
    ) -> EnqueueResult:
        """Queue one run of this job on the installed driver, or stage it in the outbox.

        Args:
            input: the input (validated against the declared type).
            run_at: run no earlier than this aware instant (past instants run now).
            delay: run no earlier than now plus this (``"30s"``, ``timedelta``, int ms; ``>= 0``).
            queue: override the declared queue.
            tenant_id: state the tenant explicitly (must agree with ``tenant(input)``).
            run_id: name the run instead of minting one.
            on_conflict: ``"dedupe"`` answers a live row's ids with ``deduped=True``; ``"error"``
                raises instead (refused when the enqueue is staged: a duplicate is known only at
                publish).
            outbox: with an outbox installed (:func:`~jobs_core.outbox.install_outbox`), the
                transaction to stage on; ``None`` stages on the store's ambient transaction if
                one is open; ``False`` bypasses the outbox and queues directly.
            order_key: for a staged enqueue, its outbox lane: rows sharing a key are published
                in staging order even by relays running side by side (``Relay(exclusive=
                False)``); rows without one share one lane. Ignored when queued directly.
            priority: override the job's priority for this row: an int from -32768 to 32767,
                lower runs first (:mod:`jobs_core.priority`); needs a driver with the
                ``priority`` capability unless it is 0.
            debounce: debounce this enqueue (``"30s"``, ``timedelta``, int ms): the row runs
                this long after the last enqueue of its key, with the last input, as long as it
                has not been claimed yet (:mod:`jobs_core.debounce`); exclusive with ``run_at``
                and ``delay``, refused with ``on_conflict="error"`` and in an outbox
                transaction; needs a driver with the ``debounce`` capability.
            debounce_max: cap the total wait of a debounced row from its first enqueue.

        Returns:
            ``EnqueueResult(id, run_id, deduped)``. A staged enqueue answers the ids the job
            will have once the relay publishes it (the staged row's id is the job id) with
            ``deduped=False``; nothing is queued if the transaction rolls back.

        Raises:
            JobInputInvalidError: ``X_JOB_INPUT_INVALID``.
            IdempotencyRequiredError: ``X_IDEMPOTENCY_REQUIRED``.
            TenantMismatchError: ``X_JOB_TENANT_MISMATCH`` (nothing written).
            JobOptionsInvalidError: ``X_JOB_OPTIONS_INVALID``.
            JobDuplicateError: ``X_JOB_DUPLICATE`` under ``on_conflict="error"``.
            OutboxNoTransactionError: ``X_OUTBOX_NO_TX`` outside a transaction when the outbox
                is installed with ``mode="required"`` (nothing written).
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` (nothing queued).
        """
        return await self._enqueue_one(
            input,
            on_conflict,
            outbox,
            run_at=run_at,
            delay=delay,
            queue=queue,
            tenant_id=tenant_id,
            run_id=run_id,
            order_key=order_key,
            priority=priority,
            debounce=debounce,
            debounce_max=debounce_max,
        )

    async def enqueue_as(
        self,
        actor: Actor,
        input: I | JSONValue,
        *,
        run_at: datetime | None = None,
        delay: Duration | None = None,
        queue: str | None = None,
        run_id: UUID | None = None,
        on_conflict: OnConflict = "dedupe",
        outbox: Any = None,
        order_key: str | None = None,
        priority: int | None = None,
        debounce: Duration | None = None,
        debounce_max: Duration | None = None,
    ) -> EnqueueResult:
        """Queue on behalf of ``actor``: tenant from ``actor.org_id``, ``enqueued_by`` its id.

        Attribution only: the body runs with the job's declared tenant, not the actor's rights.
        Same arguments (``outbox`` included), answer and errors as :meth:`enqueue`.
        """
        return await self._enqueue_one(
            input,
            on_conflict,
            outbox,
            run_at=run_at,
            delay=delay,
            queue=queue,
            run_id=run_id,
            actor=actor,
            order_key=order_key,
            priority=priority,
            debounce=debounce,
            debounce_max=debounce_max,
        )

    def enqueue_sync(
        self,
        input: I | JSONValue,
        *,
        run_at: datetime | None = None,
        delay: Duration | None = None,
        queue: str | None = None,
        tenant_id: str | None = None,
        run_id: UUID | None = None,
        on_conflict: OnConflict = "dedupe",
        outbox: Any = None,
        order_key: str | None = None,
        priority: int | None = None,
        debounce: Duration | None = None,
        debounce_max: Duration | None = None,
    ) -> EnqueueResult:
        """:meth:`enqueue` for synchronous code (a sync body, a script, a sync web view).

        Same arguments (``outbox`` included) and answer as :meth:`enqueue`. Outside a worker it
        runs on the process-wide portal loop (:mod:`jobs_core.portal`), so every thread shares
        one pool; it is safe from many threads at once and after a fork.

        Raises:
            SyncCallInLoopError: ``X_SYNC_IN_LOOP`` on a thread running an event loop (``await
                enqueue`` there).
            JobsError: as :meth:`enqueue`.
        """
        return run_sync(
            self.enqueue(
                input,
                run_at=run_at,
                delay=delay,
                queue=queue,
                tenant_id=tenant_id,
                run_id=run_id,
                on_conflict=on_conflict,
                outbox=outbox,
                order_key=order_key,
                priority=priority,
                debounce=debounce,
                debounce_max=debounce_max,
            )
        )

    def enqueue_many_sync(
        self,
        inputs: Iterable[I | JSONValue],
        *,
        run_at: datetime | None = None,
        delay: Duration | None = None,
        queue: str | None = None,
        tenant_id: str | None = None,
        on_conflict: OnConflict = "dedupe",
        outbox: Any = None,
        order_key: str | None = None,
        priority: int | None = None,
    ) -> list[EnqueueResult]:
        """:meth:`enqueue_many` for synchronous code, on the portal loop as :meth:`enqueue_sync`.

        Same arguments and answer as :meth:`enqueue_many`.

        Raises:
            SyncCallInLoopError: ``X_SYNC_IN_LOOP`` on a thread running an event loop.
            JobsError: as :meth:`enqueue_many`.
        """
        return run_sync(
            self.enqueue_many(
                inputs,
                run_at=run_at,
                delay=delay,
                queue=queue,
                tenant_id=tenant_id,
                on_conflict=on_conflict,
                outbox=outbox,
                order_key=order_key,
                priority=priority,
            )
        )

    async def _enqueue_one(
        self, input: I | JSONValue, on_conflict: OnConflict, outbox: Any, **options: Any
    ) -> EnqueueResult:
        if on_conflict not in ("dedupe", "error"):
            raise JobOptionsInvalidError(
                f"on_conflict: must be 'dedupe' or 'error', got {on_conflict!r}",
                option="on_conflict",
            )
        # Validated (tenant, key, input) before anything is staged or queued.
        req = self.build_request(input, **options)
        if req.debounce_ms is not None and on_conflict == "error":
            raise JobOptionsInvalidError(
                "debounce: a debounced enqueue meets its waiting row on purpose; use "
                "on_conflict='dedupe'",
                option="debounce",
            )
        result = await submit_one(req, outbox, staged_ok=on_conflict == "dedupe")
        if result.deduped and on_conflict == "error":
            raise JobDuplicateError(
                f"{self.name}: a live job already holds key {req.idempotency_key!r}",
                job=self.name,
                id=str(result.id),
                run_id=str(result.run_id),
            )
        return result

    async def enqueue_many(
        self,
        inputs: Iterable[I | JSONValue],
        *,
        run_at: datetime | None = None,
        delay: Duration | None = None,
        queue: str | None = None,
        tenant_id: str | None = None,
        on_conflict: OnConflict = "dedupe",
        outbox: Any = None,
        order_key: str | None = None,
        priority: int | None = None,
    ) -> list[EnqueueResult]:
        """Queue many runs of this job: one driver round trip per 1,000 inputs.

        Every input is validated before anything is written, so a bad input fails the whole call
        and queues nothing. Answers in input order; an input whose key repeats an earlier one in
        the batch (or a live row) answers that row with ``deduped=True``.

        Inside an outbox transaction (``outbox`` as in :meth:`enqueue`) the batch is staged with
        one ``stage_many``: each input answers its future job ids with ``deduped=False``, except
        one repeating an earlier input's key, which answers that input's ids with
        ``deduped=True``; whether a live row already holds a key is known only at publish.
        ``order_key`` names the batch's outbox lane and ``priority`` every row's priority, as in
        :meth:`enqueue` (``debounce`` is per enqueue only).

        Raises:
            EnqueueBatchTooLargeError: ``X_JOB_ENQUEUE_BATCH_TOO_LARGE`` above
                ``MAX_ENQUEUE_BATCH`` (10,000) inputs.
            JobOptionsInvalidError: ``X_JOB_OPTIONS_INVALID`` with ``on_conflict="error"``.
            JobsError: any of :meth:`enqueue`'s validation errors, naming the input's index.
            OutboxNoTransactionError: ``X_OUTBOX_NO_TX`` as :meth:`enqueue`.
        """
        if on_conflict != "dedupe":
            raise JobOptionsInvalidError(
                "on_conflict: enqueue_many accepts only 'dedupe' (a batch answers live rows as "
                "deduped)",
                option="on_conflict",
            )
        items: Sequence[Any] = inputs if isinstance(inputs, Sequence) else list(inputs)
        if len(items) > MAX_ENQUEUE_BATCH:
            raise EnqueueBatchTooLargeError(
                f"enqueue_many got {len(items)} inputs; at most {MAX_ENQUEUE_BATCH} per call",
                count=len(items),
            )
        reqs = []
        for index, item in enumerate(items):
            try:
                reqs.append(
                    self.build_request(
                        item,
                        run_at=run_at,
                        delay=delay,
                        queue=queue,
                        tenant_id=tenant_id,
                        order_key=order_key,
                        priority=priority,
                    )
                )
            except Exception as exc:
                if hasattr(exc, "meta"):
                    exc.meta["index"] = index
                raise
        if not reqs:
            return []
        return await submit_many(reqs, outbox)

    def describe(self) -> dict[str, Any]:
        """Answer a JSON-able descriptor of the declaration (for ``jobsctl manifest``)."""
        concurrency: Any
        if isinstance(self.concurrency, Concurrency):
            concurrency = {
                "limit": self.concurrency.limit,
                "per_key": True,
                "when_busy": self.concurrency.when_busy,
            }
        else:
            concurrency = self.concurrency
        return {
            "kind": "job",
            "name": self.name,
            "queue": self.queue,
            "input_schema": self.adapter.json_schema(),
            "idempotency_key": "input" if self.idempotency_key == INPUT_KEY else "function",
            "tenant": "none" if self.tenant == "none" else "function",
            "retry": {
                "attempts": self.retry.attempts,
                "backoff": self.retry.backoff,
                "delay_ms": self.retry.delay_ms,
                "max_delay_ms": self.retry.max_delay_ms,
                "jitter": self.retry.jitter,
                "dead_letter": self.retry.dead_letter,
            },
            "max_attempts": self.max_attempts,
            "concurrency": concurrency,
            "rate": None if self.rate_limit is None else self.rate_limit.describe(),
            "timeout_ms": self.timeout_ms,
            "step_timeout_ms": self.step_timeout_ms,
            "event_poll_ms": self.event_poll_ms,
            "compensates": self.compensates,
            "on_settled": self.on_settled is not None,
            "sync_body": not self.is_async,
            "priority": self.priority,
        }

    async def run_inline(self, input: I | JSONValue) -> R:
        """Run the body through the real step runner on the installed driver (tests only).

        Steps persist in the driver's step store under a fresh run id; sleeps and event waits are
        waited out in real time and the body replays, as a worker would. Errors propagate
        (no retries, no compensation).
        """
        from jobs_core.execute import run_inline

        return cast(R, await run_inline(self, input, current_driver()))


def _key_shape(key: object) -> str:
    """Describe a refused idempotency key without quoting it (it may come from the payload)."""
    if isinstance(key, str):
        return "text containing U+0000 (NUL)" if key else "''"
    return "None" if key is None else f"a value of type {type(key).__name__}, not text"


def _timing(run_at: datetime | None, delay: Duration | None) -> tuple[int, datetime | None]:
    if run_at is not None and delay is not None:
        raise JobOptionsInvalidError("run_at and delay are exclusive: pass one", option="run_at")
    if run_at is not None:
        if not isinstance(run_at, datetime) or run_at.tzinfo is None:
            raise JobOptionsInvalidError(
                "run_at: must be an aware datetime (e.g. datetime.now(UTC) + timedelta(hours=1))",
                option="run_at",
            )
        try:
            run_at.astimezone(UTC)
        except OverflowError:
            raise JobOptionsInvalidError(
                f"run_at: {run_at.isoformat()} is past the last instant a datetime holds in UTC",
                option="run_at",
            ) from None
        return 0, run_at
    if delay is None:
        return 0, None
    try:
        return parse_duration(delay, field="delay", allow_zero=True), None
    except ValueError as exc:
        raise JobOptionsInvalidError(str(exc), option="delay") from None


def _duration_field(
    problems: list[str], name: str, value: Duration | None, default: int | None = None
) -> int | None:
    if value is None:
        return default
    problem = duration_problem(value)
    if problem is not None:
        problems.append(f"{name}: {problem}")
        return default
    return parse_duration(value, field=name)


def input_key(stored: JSONValue) -> str:
    """Answer the idempotency key ``idempotency_key="input"`` derives from a stored input.

    The SHA-256 of the input's canonical JSON text: keys sorted, no whitespace, UTF-8, so two
    inputs equal as JSON (whatever their key order) share one key.

    Args:
        stored: the input's JSON form, as the row stores it.

    Returns:
        ``"sha256:"`` and 64 hex digits.
    """
    text = json.dumps(stored, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class _BodyShape:
    """How to call a body: how many of ``(input, step, ctx)`` by position, which by keyword.

    Attributes:
        positional: the first ``positional`` of :data:`BODY_ARGUMENTS` go by position.
        keywords: ``(parameter name, index into BODY_ARGUMENTS)`` pairs passed by keyword.
    """

    positional: int
    keywords: tuple[tuple[str, int], ...]


def _body_shape(body: Any) -> _BodyShape | str:
    """Answer how ``body`` takes ``(input, step, ctx)``, or the declaration problem.

    A parameter named ``input``, ``step`` or ``ctx`` receives that value; any other required
    positional parameter receives the first of them no parameter names, in order, so
    ``(order)``, ``(order, step)`` and ``(order, step, ctx)`` read as written. Parameters with
    defaults that name none of the three keep their defaults. ``*args`` takes the three by
    position (a decorator's ``(*args, **kwargs)`` wrapper, say).
    """
    if not callable(body):
        return "body: must be a function taking (input), (input, step) or (input, step, ctx)"
    try:
        params = list(inspect.signature(body).parameters.values())
    except (TypeError, ValueError):
        # No signature to read (a builtin, say): hand it all three, as the worker always did.
        return _BodyShape(3, ())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        try:
            inspect.signature(body).bind(None, None, None)
        except TypeError:
            return "body: must accept (input, step, ctx) alongside its *args"
        return _BodyShape(3, ())
    named = {p.name for p in params if p.name in BODY_ARGUMENTS and p.kind is not p.POSITIONAL_ONLY}
    free = [i for i, arg in enumerate(BODY_ARGUMENTS) if arg not in named]
    positional: list[int] = []
    keywords: list[tuple[str, int]] = []
    keyword_only = False
    for p in params:
        if p.kind is p.VAR_KEYWORD:
            continue
        if p.name in named:
            keywords.append((p.name, BODY_ARGUMENTS.index(p.name)))
            keyword_only = keyword_only or p.kind is p.KEYWORD_ONLY
            continue
        if p.kind is p.KEYWORD_ONLY or not free:
            if p.default is p.empty:
                return (
                    f"body: parameter {p.name!r} would receive nothing (a body takes input, "
                    "step and ctx, by position or by those names)"
                )
            continue
        if p.default is not p.empty:
            continue
        slot = free.pop(0)
        if p.kind is p.POSITIONAL_ONLY:
            positional.append(slot)
        else:
            keywords.append((p.name, slot))
    if positional != list(range(len(positional))):
        return "body: its positional-only parameters must come in the order (input, step, ctx)"
    # Parameters that receive input, step, ctx in that order go by position: the worker then
    # calls the function itself, or a one-call adapter.
    order = [slot for _, slot in keywords]
    if not positional and not keyword_only and order == list(range(len(order))):
        return _BodyShape(len(order), ())
    return _BodyShape(len(positional), tuple(keywords))


def _adapt_body(body: Callable[..., Any]) -> Callable[[Any, Any, Any], Any]:
    """Answer a callable taking ``(input, step, ctx)`` that calls ``body`` as it asks."""
    shape = _body_shape(body)
    if isinstance(shape, str) or (shape.positional == 3 and not shape.keywords):
        return body
    if not shape.keywords:
        # One adapter per count: the body is called once per attempt, so no slicing.
        if shape.positional == 2:
            return lambda input, step, ctx: body(input, step)
        if shape.positional == 1:
            return lambda input, step, ctx: body(input)
        return lambda input, step, ctx: body()
    count, keywords = shape.positional, shape.keywords

    def call(input: Any, step: Any, ctx: Any) -> Any:
        given = (input, step, ctx)
        return body(*given[:count], **{name: given[slot] for name, slot in keywords})

    return call


def job(
    *,
    input: Any = _MISSING,
    idempotency_key: Callable[[Any], str] | Literal["input"] | None = None,
    tenant: Callable[[Any], str] | Literal["none"] | None = None,
    retry: Retry | None = None,
    name: str | None = None,
    queue: str = "default",
    concurrency: int | Concurrency | None = None,
    rate: Rate | None = None,
    timeout: Duration | None = None,
    step_timeout: Duration | None = None,
    event_poll: Duration | None = None,
    compensates: bool = False,
    on_settled: Callable[[Settled], Any] | None = None,
    on_settled_timeout: Duration = ON_SETTLED_TIMEOUT_MS,
    registry: JobRegistry | None = None,
    declared_at: tuple[str, int] | None = None,
    priority: int = DEFAULT_PRIORITY,
) -> Callable[[Callable[..., Any]], JobHandle[Any, Any]]:
    """Declare a job; decorate ``async def body(input, step, ctx)`` (or a plain ``def``).

    The body takes what it asks for: ``(input)``, ``(input, step)`` or ``(input, step, ctx)``,
    under any names, or any of the three by the names ``input``, ``step`` and ``ctx`` (keyword-only
    too: ``(input, *, ctx)``). The signature is checked here, at declaration.

    Args:
        input: the input type: a pydantic model or anything ``TypeAdapter`` accepts.
        idempotency_key: **required**, ``(input) -> str`` (non-empty): one live row per key; or
            ``"input"``: the key is a SHA-256 of the input's canonical JSON (:func:`input_key`),
            so a second enqueue of an equal input while the first is live is deduped.
        tenant: **required**, ``(input) -> str`` naming the org, or ``"none"``.
        retry: the :class:`~jobs_core.retry.Retry` policy (default 3 attempts, exponential).
        name: the durable name rows carry (default ``f"{module}.{qualname}"``).
        queue: the queue (default ``"default"``).
        concurrency: fleet-wide cap: an ``int >= 1`` or a :class:`~jobs_core.limits.Concurrency`.
        rate: fleet-wide cap on attempts started per rolling window, a
            :class:`~jobs_core.rate.Rate` (needs a driver with the ``rate`` capability).
        timeout: whole-attempt deadline.
        step_timeout: ceiling for one ``step.run``.
        event_poll: how long a waiting step parks between checks (default 30 s, or 15 min on a
            bus that wakes waiters).
        compensates: allow ``step.run(..., compensate=fn)``; rows get 2 extra attempts to unwind.
        on_settled: hook told once per ending.
        on_settled_timeout: ceiling across the hook's tries (default ``ON_SETTLED_TIMEOUT_MS``,
            30 s).
        registry: the registry to join (default :data:`REGISTRY`).
        declared_at: ``(file, line)`` of the declaration, for a factory over ``job()`` whose jobs
            share one body: :func:`declaration_site` of the factory's caller. Default: the
            body's own location.
        priority: the rows' default claim priority, an int from -32768 to 32767, lower runs
            first (default 0; see :mod:`jobs_core.priority`); ``enqueue(priority=...)``
            overrides it per row.

    Returns:
        A decorator answering the :class:`JobHandle`.

    Raises:
        IdempotencyRequiredError: ``X_IDEMPOTENCY_REQUIRED`` when ``idempotency_key`` is missing.
        TenantRequiredError: ``X_JOB_TENANT_REQUIRED`` when ``tenant`` is missing.
        JobDeclarationInvalidError: ``X_JOB_DECLARATION_INVALID`` for any other bad field. Each
            names every problem at once in its message and ``meta["problems"]``.
        JobDuplicateError: ``X_JOB_DUPLICATE`` when another declaration holds the name.
    """

    def decorate(body: Callable[..., Any]) -> JobHandle[Any, Any]:
        problems: list[str] = []
        missing_key = idempotency_key is None
        missing_tenant = tenant is None
        if input is _MISSING:
            problems.append("input: required (a pydantic model or a type TypeAdapter accepts)")
        else:
            try:
                adapter = TypeAdapter(input)
            except Exception as exc:
                problems.append(f"input: {input!r} is not a type pydantic can validate ({exc})")
            else:
                # A forward reference pydantic cannot resolve yet builds a deferred adapter that
                # fails at every enqueue and run; refuse it here, at declaration.
                if not getattr(adapter, "pydantic_complete", True):
                    problems.append(
                        f"input: {input!r} is not fully defined (an unresolved forward "
                        "reference); define every referenced type before the job"
                    )
        if missing_key:
            problems.append(
                'idempotency_key: required, a function (input) -> non-empty str, or "input"'
            )
        elif idempotency_key != INPUT_KEY and not callable(idempotency_key):
            problems.append('idempotency_key: must be a function (input) -> str or "input"')
        if missing_tenant:
            problems.append('tenant: required, a function (input) -> org id, or "none"')
        elif tenant != "none" and not callable(tenant):
            problems.append('tenant: must be a function (input) -> str or the literal "none"')
        policy = Retry() if retry is None else retry
        if not isinstance(policy, Retry):
            problems.append(f"retry: must be a Retry(...), got {type(policy).__name__}")
            policy = Retry()
        else:
            problems.extend(policy.problems())
        job_name = name if name is not None else _default_name(body)
        if not isinstance(job_name, str) or not job_name.strip() or _NUL in job_name:
            problems.append("name: must be non-empty text without U+0000 (NUL)")
        if not isinstance(queue, str) or not queue.strip() or _NUL in queue:
            problems.append("queue: must be non-empty text without U+0000 (NUL)")
        if isinstance(concurrency, Concurrency):
            problems.extend(concurrency.problems())
        elif concurrency is not None and (
            isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
        ):
            problems.append(
                f"concurrency: must be an int >= 1 or Concurrency(...), got {concurrency!r}"
            )
        if isinstance(rate, Rate):
            problems.extend(rate.problems())
        elif rate is not None:
            problems.append(f"rate: must be a Rate(limit, per=...), got {rate!r}")
        timeout_ms = _duration_field(problems, "timeout", timeout)
        step_timeout_ms = _duration_field(problems, "step_timeout", step_timeout)
        event_poll_ms = _duration_field(problems, "event_poll", event_poll)
        settled_timeout_ms = _duration_field(problems, "on_settled_timeout", on_settled_timeout)
        if registry is not None and not isinstance(registry, JobRegistry):
            problems.append(f"registry: must be a JobRegistry, got {type(registry).__name__}")
        if not isinstance(compensates, bool):
            problems.append(f"compensates: must be True or False, got {compensates!r}")
        if on_settled is not None and not callable(on_settled):
            problems.append("on_settled: must be a function (settled) -> None")
        if declared_at is not None and not (
            isinstance(declared_at, tuple)
            and len(declared_at) == 2
            and isinstance(declared_at[0], str)
            and isinstance(declared_at[1], int)
        ):
            problems.append("declared_at: must be (file, line), e.g. declaration_site()")
        bad_priority = priority_problem(priority)
        if bad_priority is not None:
            problems.append(bad_priority)
        shape = _body_shape(body)
        if isinstance(shape, str):
            problems.append(shape)
        if problems:
            error_type: type[
                JobDeclarationInvalidError | IdempotencyRequiredError | TenantRequiredError
            ]
            if missing_key:
                error_type = IdempotencyRequiredError
            elif missing_tenant:
                error_type = TenantRequiredError
            else:
                error_type = JobDeclarationInvalidError
            raise error_type(
                f"job {job_name!r} is declared wrong: " + "; ".join(problems),
                job=job_name,
                problems=problems,
            )
        handle: JobHandle[Any, Any] = JobHandle(
            body,
            name=job_name,
            queue=queue,
            input_type=input,
            idempotency_key=cast(Callable[[Any], str] | Literal["input"], idempotency_key),
            tenant=cast(Callable[[Any], str] | Literal["none"], tenant),
            retry=policy,
            concurrency=concurrency,
            timeout_ms=timeout_ms,
            step_timeout_ms=step_timeout_ms,
            event_poll_ms=event_poll_ms,
            compensates=compensates,
            on_settled=on_settled,
            on_settled_timeout_ms=settled_timeout_ms or ON_SETTLED_TIMEOUT_MS,
            registry=registry if isinstance(registry, JobRegistry) else REGISTRY,
            declared_at=declared_at,
            priority=priority,
            rate=rate,
        )
        handle.registry.register(handle)
        return handle

    return decorate


def _default_name(body: Callable[..., Any]) -> str:
    return f"{getattr(body, '__module__', 'main')}.{getattr(body, '__qualname__', 'job')}"


__all__ = [
    "BODY_ARGUMENTS",
    "INPUT_KEY",
    "REGISTRY",
    "RESERVED_STEP_NAMES",
    "JobHandle",
    "JobRegistry",
    "Settled",
    "declaration_site",
    "input_key",
    "job",
]
