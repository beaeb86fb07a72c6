"""Durable steps: the runner behind a body's ``step`` argument.

Every attempt replays the body from the start. A step that completed on an earlier attempt
answers its persisted JSON form without calling its function; the first step that has not
completed runs, and its output is persisted (fenced on the attempt's claim) before the body goes
on. Sleeps and event waits park the run (:class:`StepSuspended`, control flow, never a failure);
when the run fails for good a compensating job replays to its first incomplete step
(:class:`UnwindReached`) and runs its compensators newest first, each recorded as
``compensate:<name>`` so a crash mid-unwind resumes where it stopped.

Suspension and the unwind marker derive from :class:`BaseException` so that a body's
``except Exception`` cannot swallow them by accident.
"""

from __future__ import annotations

import asyncio
import inspect
import types
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

from pydantic import TypeAdapter, ValidationError

from jobs_core import faults
from jobs_core._durations import Duration, parse_duration
from jobs_core._threads import run_in_thread
from jobs_core.clock import Clock
from jobs_core.context import CancelSignal
from jobs_core.driver import EventBus, EventQuery, StepStore
from jobs_core.errors import (
    AbortedError,
    EventInvalidError,
    JobDeclarationInvalidError,
    JobOptionsInvalidError,
    JobsError,
    JobTimeoutError,
    NotImplementedByDriverError,
    StepDuplicateError,
    StepNameInvalidError,
    StepOutcomeUnknownError,
    StepOutputUnserializableError,
    StepTimeoutError,
)
from jobs_core.faults import FaultPoint
from jobs_core.serialization import NotJSONError, to_json_form
from jobs_core.types import (
    DEFAULT_EVENT_POLL_MS,
    WAKING_EVENT_POLL_MS,
    ErrorInfo,
    Fence,
    JSONValue,
    StepRecord,
    StepWrite,
)

if TYPE_CHECKING:
    from jobs_core.children import Children
    from jobs_core.job import JobHandle

T = TypeVar("T")

UNWINDING = "unwinding"
"""The reserved step whose presence means the run failed for good and is unwinding."""

COMPENSATE_PREFIX = "compensate:"
"""The reserved prefix of compensation steps."""

MAX_STEP_NAME = 200
"""The longest step name accepted."""


class StepSuspended(BaseException):
    """Raised out of a body to park the run until ``wake_at`` (not a failure, no attempt spent).

    Attributes:
        wake_at: when the run should be handed back (UTC, on the step store's clock).
        step: the step that parked it.
    """

    def __init__(self, wake_at: datetime, step: str) -> None:
        """Park until ``wake_at`` because of ``step``."""
        super().__init__(f"suspended at step {step!r} until {wake_at.isoformat()}")
        self.wake_at = wake_at
        self.step = step


class UnwindReached(BaseException):
    """Raised during an unwind's replay at the first step that never completed."""


@dataclass(frozen=True, slots=True)
class Compensator:
    """A completed step's undo, collected while the body replays."""

    step: str
    fn: Callable[..., Any]
    output: JSONValue


_SHAPES: weakref.WeakKeyDictionary[Callable[..., Any], tuple[bool, bool]] = (
    weakref.WeakKeyDictionary()
)
"""Plain function -> :func:`_shape` of it; an entry goes with its function."""


def _shape(fn: Callable[..., Any]) -> tuple[bool, bool]:
    """Answer whether ``fn`` takes ``cancel=`` and whether it is a coroutine function.

    Cached per plain function: ``inspect.signature`` costs more than a no-op step's own write.
    Bound methods, partials and callable objects are new objects per call, so they are not.
    """
    if type(fn) is not types.FunctionType:
        return _accepts_cancel(fn), inspect.iscoroutinefunction(fn)
    shape = _SHAPES.get(fn)
    if shape is None:
        shape = _SHAPES[fn] = (_accepts_cancel(fn), inspect.iscoroutinefunction(fn))
    return shape


def _accepts_cancel(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "cancel" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def error_info(error: BaseException) -> ErrorInfo:
    """Summarise ``error`` for storage: message, code and stack as text.

    The traceback is rendered and then dropped from the exception so its frames (and their locals)
    are not kept alive by the stored error (FIELD-FAILURES C34).
    """
    import traceback

    stack = "".join(traceback.format_exception(error))[-8_000:]
    error.__traceback__ = None
    message = str(error) or type(error).__name__
    code = getattr(error, "code", None)
    return ErrorInfo(
        message=message[:2_000], code=code if isinstance(code, str) else None, stack=stack
    )


class StepRunner:
    """The async ``step`` a job body receives.

    One runner serves one attempt. Its writes are fenced on the attempt's claim; once the attempt
    is aborted (cancelled, lease lost, timed out) every write raises ``X_ABORTED``.

    Attributes:
        writes: step records this attempt wrote so far (the worker's stuck-run check reads it).
    """

    def __init__(
        self,
        *,
        store: StepStore,
        job_id: UUID | None,
        fence: Fence | None,
        run_id: UUID,
        job_name: str,
        records: list[StepRecord],
        cancel: CancelSignal,
        clock: Clock,
        events: EventBus | None,
        step_timeout_ms: int | None = None,
        event_poll_ms: int | None = None,
        compensates: bool = False,
        children: Children | None = None,
    ) -> None:
        """Create a runner over the records already persisted for ``run_id``.

        ``children`` carries the driver's stores ``invoke``/``gather`` need (``None``: the
        driver lacks the ``children`` or ``events`` capability, and they raise
        ``X_NOT_IMPLEMENTED``).
        """
        self._store = store
        self._job_id = job_id
        self._fence = fence
        self._run_id = run_id
        self._job_name = job_name
        self._records: dict[str, StepRecord] = {r.name: r for r in records}
        self._cancel = cancel
        self._clock = clock
        self._events = events
        self._step_timeout_ms = step_timeout_ms
        self._event_poll_ms = event_poll_ms
        self._compensates = compensates
        self._children = children
        self._names: set[str] = set()
        self._unnamed: dict[str, int] = {}
        self._aborted: JobsError | None = None
        self.compensators: list[Compensator] = []
        self.suspension: StepSuspended | None = None
        self.writes = 0

    @property
    def unwinding(self) -> bool:
        """Whether the run is unwinding (the ``unwinding`` step is persisted)."""
        return UNWINDING in self._records

    def abort(self, reason: JobsError) -> None:
        """Refuse every later write of this attempt (``X_ABORTED``) because of ``reason``."""
        if self._aborted is None:
            self._aborted = reason

    async def run(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        compensate: Callable[..., Any] | None = None,
        once: bool = False,
    ) -> JSONValue:
        """Run ``fn(*args)`` once ever in this run and answer its persisted JSON form.

        Args:
            name: the replay key, unique and deterministic within the run.
            fn: sync (runs in a thread) or async; given ``cancel=`` if it accepts it.
            *args: positional arguments for ``fn``.
            compensate: ``undo(output, cancel=...)`` run if the run fails for good (needs
                ``job(compensates=True)``).
            once: at most once: ``started`` is persisted before ``fn`` runs.

        Returns:
            The JSON form of ``fn``'s result, on the first attempt and on every replay.

        Raises:
            StepDuplicateError: ``X_STEP_DUPLICATE``.
            StepNameInvalidError: ``X_STEP_NAME_INVALID`` (empty, too long, reserved).
            StepOutputUnserializableError: ``X_STEP_OUTPUT_UNSERIALIZABLE`` (terminal).
            StepOutcomeUnknownError: ``X_STEP_OUTCOME_UNKNOWN`` for a ``once`` step found
                started without completion (terminal).
            StepTimeoutError: ``X_STEP_TIMEOUT`` past ``step_timeout``.
            AbortedError: ``X_ABORTED`` when the attempt lost its claim.
        """
        self._claim_name(name)
        if compensate is not None and not self._compensates:
            raise JobDeclarationInvalidError(
                f"step {name!r} passes compensate= but the job is not declared compensates=True",
                step=name,
            )
        record = self._records.get(name)
        if record is not None and record.status == "completed":
            if compensate is not None:
                self.compensators.append(Compensator(name, compensate, record.output))
            return record.output
        if self.unwinding:
            raise UnwindReached(name)
        if record is not None and record.status == "started":
            raise StepOutcomeUnknownError(
                f"once step {name!r} started and its completion was never recorded; resolve it "
                "with jobsctl resolve-step",
                step=name,
            )
        started = self._clock.now()
        attempts = record.attempts if record is not None else 0
        if faults.hooked():
            await self._boundary("before", name)
        if once:
            await self._write(StepRecord(name, "started", started_at=started, once=True))
        try:
            value = await self._invoke(name, fn, args, self._step_timeout_ms)
        except StepTimeoutError:
            if not once:
                await self._record_failure(name, attempts, "step timed out", started)
            raise
        except Exception as exc:
            await self._record_failure(name, attempts, str(exc) or type(exc).__name__, started)
            raise
        try:
            output = to_json_form(value)
        except NotJSONError as exc:
            raise StepOutputUnserializableError(
                f"step {name!r} returned a value with no JSON form at {exc.path}: {exc.reason}",
                step=name,
                path=exc.path,
            ) from None
        if faults.hooked():
            await self._boundary("returned", name)
        await self._write(
            StepRecord(
                name,
                "completed",
                output=output,
                started_at=started,
                completed_at=self._clock.now(),
                attempts=attempts,
                once=once,
            )
        )
        if faults.hooked():
            await self._boundary("persisted", name)
        if compensate is not None:
            self.compensators.append(Compensator(name, compensate, output))
        return output

    async def sleep(
        self, name_or_duration: str | Duration, duration: Duration | None = None
    ) -> None:
        """Park the run for a duration; ``sleep("3d")`` or ``sleep("nudge-wait", "3d")``.

        Without a name the step is named ``sleep:<ms>ms``, then ``sleep:<ms>ms#2``, ``#3``... for
        later unnamed sleeps of the same length in the run (in the order the body reaches them,
        which replays identically). Not an attempt.

        Raises:
            JobOptionsInvalidError: ``X_JOB_OPTIONS_INVALID`` for a bad duration.
        """
        if duration is None:
            ms = _duration_ms(name_or_duration)
            base = f"sleep:{ms}ms"
            self._unnamed[base] = seen = self._unnamed.get(base, 0) + 1
            name = base if seen == 1 else f"{base}#{seen}"
        else:
            if not isinstance(name_or_duration, str):
                raise StepNameInvalidError("step.sleep(name, duration): name must be text")
            name, ms = name_or_duration, _duration_ms(duration)
        await self._park(name, lambda now: now + timedelta(milliseconds=ms))

    async def sleep_until(self, name: str, when: datetime) -> None:
        """Park the run until an aware instant (a past instant completes at once).

        Raises:
            JobOptionsInvalidError: ``X_JOB_OPTIONS_INVALID`` for a naive datetime.
        """
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise JobOptionsInvalidError("step.sleep_until: when must be an aware datetime")
        await self._park(name, lambda _now: when)

    async def wait_for_event(
        self,
        name: str,
        event: str,
        *,
        schema: Any = None,
        match: Mapping[str, JSONValue] | None = None,
        timeout: Duration | None = None,
        required: bool = False,
        correlation_key: str | None = None,
    ) -> Any:
        """Park until an event named ``event`` is published, and answer it parsed by ``schema``.

        Only events published after the wait began (on the bus's clock) match; ``match`` keys
        must equal the payload's top-level values; ``correlation_key`` must equal the publish's.

        Args:
            name: the step name.
            event: the event name.
            schema: a pydantic model (or any type ``TypeAdapter`` accepts) the payload must fit.
            match: top-level payload equality filter.
            timeout: give up after this long (answer ``None``, or raise with ``required``).
            required: raise ``X_JOB_TIMEOUT`` instead of answering ``None`` on timeout.
            correlation_key: only events published with this key.

        Raises:
            EventInvalidError: ``X_JOB_EVENT_INVALID`` (terminal) when the stored event does not
                fit ``schema``; the message carries the issues, never the payload.
            JobTimeoutError: ``X_JOB_TIMEOUT`` on timeout with ``required=True``.
            JobOptionsInvalidError: ``X_JOB_OPTIONS_INVALID`` (terminal) when ``schema`` is
                ``None`` or not a type pydantic can validate.
            NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` with no event bus.
        """
        self._claim_name(name)
        adapter = _event_adapter(name, schema)
        _check_event_names(name, event, correlation_key)
        record = self._records.get(name)
        if record is not None and record.status == "completed":
            return self._event_answer(name, adapter, record.output, required)
        if self.unwinding:
            raise UnwindReached(name)
        bus = self._events
        if bus is None:
            raise NotImplementedByDriverError(
                "wait_for_event needs an event bus: use a driver with the 'events' capability",
                step=name,
            )
        now = await bus.now()
        if record is None or record.status != "waiting":
            deadline = now + timedelta(milliseconds=_duration_ms(timeout)) if timeout else None
            record = StepRecord(
                name, "waiting", started_at=now, wake_at=deadline, event=event, match=match
            )
            await self._park_write(record)
        since = record.started_at or now
        found = await bus.find(EventQuery(event, since, match, correlation_key))
        if found is not None:
            output = {"event_id": str(found.id), "payload": found.payload}
            answer = self._event_answer(name, adapter, output, required)
            await self._park_write(
                replace(record, status="completed", output=output, completed_at=now)
            )
            return answer
        if record.wake_at is not None and now >= record.wake_at:
            await self._park_write(
                replace(record, status="completed", output=None, completed_at=now)
            )
            return self._event_answer(name, adapter, None, required)
        poll = self._event_poll_ms or (
            WAKING_EVENT_POLL_MS if bus.wakes_waiters else DEFAULT_EVENT_POLL_MS
        )
        wake = now + timedelta(milliseconds=poll)
        if record.wake_at is not None:
            wake = min(wake, record.wake_at)
        raise self._suspend(wake, name)

    async def invoke(
        self,
        name: str,
        job: JobHandle[Any, Any],
        input: Any,
        *,
        cancel_children: bool = True,
        **enqueue_options: Any,
    ) -> JSONValue:
        """Run ``job`` as a child of this run and answer its result (the JSON form it stored).

        The child is enqueued once ever (its id and idempotency key derive from this run's id
        and ``name``); the run then parks, holding no worker slot, until the child settles (its
        settle publishes the ``jobs.child.settled`` event that wakes this run).

        Args:
            name: the step name.
            job: the child's job handle.
            input: the child's input (validated as :meth:`JobHandle.enqueue` does).
            cancel_children: cancelling this run cancels the child while it is live.
            **enqueue_options: ``run_at``, ``delay``, ``queue``, ``tenant_id`` for the child.

        Raises:
            ChildJobFailedError: the child ended ``dead``, ``failed`` or ``cancelled`` (or was
                removed); its ``code`` is the child's code (``X_JOB_CHILD_FAILED`` without
                one). Terminal.
            JobOptionsInvalidError: ``X_JOB_OPTIONS_INVALID`` for another enqueue option.
            NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` without the ``children`` and
                ``events`` capabilities.
            JobsError: the enqueue's own validation errors (``X_JOB_INPUT_INVALID``, ...).
        """
        from jobs_core.children import await_children

        return await await_children(
            self,
            name,
            [(job, input)],
            single=True,
            fail_fast=True,
            cancel_children=cancel_children,
            options=enqueue_options,
        )

    async def gather(
        self,
        name: str,
        calls: Sequence[tuple[JobHandle[Any, Any], Any]],
        *,
        fail_fast: bool = False,
        cancel_children: bool = True,
        **enqueue_options: Any,
    ) -> list[JSONValue]:
        """Fan out: run every ``(job, input)`` as a child; answer their results in input order.

        Enqueued together once ever (like :meth:`invoke`); the run parks, holding no slot, and
        each child's settle wakes it to look again. One child failing fails the step once every
        child settled, or at once with ``fail_fast`` (its live siblings are then cancelled when
        ``cancel_children``).

        Raises:
            ChildJobFailedError: the first failed child in input order (see :meth:`invoke`).
            JobOptionsInvalidError: ``X_JOB_OPTIONS_INVALID`` for another enqueue option.
            NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` as :meth:`invoke`.
        """
        from jobs_core.children import await_children

        answer = await await_children(
            self,
            name,
            list(calls),
            single=False,
            fail_fast=fail_fast,
            cancel_children=cancel_children,
            options=enqueue_options,
        )
        return list(answer) if isinstance(answer, list) else []

    async def begin_unwind(self, info: ErrorInfo) -> None:
        """Persist ``unwinding`` (with the failure that caused it) before any compensator runs."""
        record = StepRecord(
            UNWINDING,
            "completed",
            output={"message": info.message, "code": info.code, "stack": info.stack},
            started_at=self._clock.now(),
            completed_at=self._clock.now(),
        )
        await self._write(record)

    def unwind_error(self) -> ErrorInfo:
        """Answer the failure recorded by :meth:`begin_unwind`."""
        output = self._records[UNWINDING].output or {}
        return ErrorInfo(
            message=str(output.get("message", "")),
            code=output.get("code"),
            stack=output.get("stack"),
        )

    async def compensate_all(self) -> int:
        """Run the collected compensators newest first, skipping those already recorded.

        Returns:
            How many compensators ran in this call.

        Raises:
            Exception: whatever a compensator raised (the ones before it are recorded).
        """
        ran = 0
        for comp in reversed(self.compensators):
            step = COMPENSATE_PREFIX + comp.step
            record = self._records.get(step)
            if record is not None and record.status == "completed":
                continue
            started = self._clock.now()
            if faults.hooked():
                await self._boundary("before", step)
            await self._invoke(step, comp.fn, (comp.output,), None)
            if faults.hooked():
                await self._boundary("returned", step)
            await self._write(
                StepRecord(step, "completed", started_at=started, completed_at=self._clock.now())
            )
            if faults.hooked():
                await self._boundary("persisted", step)
            ran += 1
        return ran

    def _event_answer(
        self, name: str, adapter: TypeAdapter[Any], output: JSONValue, required: bool
    ) -> Any:
        if output is None:
            if required:
                # Terminal: a replay meets the same recorded timeout, so a retry cannot help.
                raise JobTimeoutError(
                    f"wait_for_event {name!r} timed out", step=name, terminal=True
                )
            return None
        try:
            return adapter.validate_python(output["payload"])
        except ValidationError as exc:
            issues = exc.errors(include_url=False, include_input=False, include_context=False)
            raise EventInvalidError(
                f"event for step {name!r} does not fit its schema: "
                + "; ".join(
                    f"{'.'.join(map(str, i['loc'])) or '(root)'}: {i['msg']}" for i in issues
                ),
                step=name,
                issues=[{"loc": list(i["loc"]), "msg": i["msg"]} for i in issues],
            ) from None

    async def _park(self, name: str, wake_of: Callable[[datetime], datetime]) -> None:
        self._claim_name(name)
        record = self._records.get(name)
        if record is not None and record.status == "completed":
            return
        if self.unwinding:
            raise UnwindReached(name)
        now = await self._store.now()
        if record is None or record.status != "waiting" or record.wake_at is None:
            wake = wake_of(now)
            if wake <= now:
                await self._park_write(
                    StepRecord(name, "completed", started_at=now, completed_at=now)
                )
                return
            await self._park_write(StepRecord(name, "waiting", started_at=now, wake_at=wake))
            raise self._suspend(wake, name)
        if record.wake_at <= now:
            await self._park_write(replace(record, status="completed", completed_at=now))
            return
        raise self._suspend(record.wake_at, name)

    async def _park_write(self, record: StepRecord) -> None:
        """Write a sleep's or a wait's record between its ``before`` and ``persisted`` boundaries.

        A parking step has no function, so it has no ``returned`` boundary; a crash test still
        needs to stop a worker just before and just after each of its writes.
        """
        if faults.hooked():
            await self._boundary("before", record.name)
        await self._write(record)
        if faults.hooked():
            await self._boundary("persisted", record.name)

    async def _boundary(self, point: FaultPoint, step: str) -> None:
        # Callers check faults.hooked() first: with no hook a boundary then costs no coroutine.
        await faults.boundary(point, self._job_name, self._run_id, step)

    def _suspend(self, wake_at: datetime, step: str) -> StepSuspended:
        suspension = StepSuspended(wake_at, step)
        if self.suspension is None or wake_at < self.suspension.wake_at:
            self.suspension = suspension
        return suspension

    def _claim_name(self, name: str) -> None:
        if self.suspension is not None:
            # The body swallowed a suspension and went on: later steps must not run before the
            # park they come after has ended.
            raise self.suspension
        if not isinstance(name, str) or not name or len(name) > MAX_STEP_NAME or "\x00" in name:
            raise StepNameInvalidError(
                f"step name {name!r} must be non-empty text of at most {MAX_STEP_NAME} "
                "characters without U+0000"
            )
        if name == UNWINDING or name.startswith(COMPENSATE_PREFIX):
            raise StepNameInvalidError(f"step name {name!r} is reserved", step=name)
        if name in self._names:
            raise StepDuplicateError(
                f"step {name!r} is used twice in one run; step names are the replay key", step=name
            )
        self._names.add(name)

    async def _write(self, record: StepRecord) -> None:
        if self._aborted is not None:
            raise AbortedError(
                f"step {record.name!r} not written: the attempt was stopped ({self._aborted.code})",
                step=record.name,
                reason=self._aborted.code,
            )
        landed = await self._store.write(StepWrite(self._job_id, self._fence, self._run_id, record))
        if not landed:
            self._aborted = AbortedError("the claim was lost")
            raise AbortedError(
                f"step {record.name!r} not written: this attempt no longer owns the job",
                step=record.name,
            )
        self._records[record.name] = record
        self.writes += 1

    async def _record_failure(
        self, name: str, attempts: int, message: str, started: datetime
    ) -> None:
        try:
            await self._write(
                StepRecord(
                    name, "failed", started_at=started, attempts=attempts + 1, error=message[:2_000]
                )
            )
        except AbortedError:
            return

    async def _invoke(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        timeout_ms: int | None,
    ) -> Any:
        accepts_cancel, is_async = _shape(fn)
        # The step's own signal (a child of the attempt's) exists only for a function that takes
        # it or a deadline that fires it.
        signal = self._cancel.child() if accepts_cancel or timeout_ms is not None else None
        kwargs = {"cancel": signal} if accepts_cancel else {}
        if is_async and timeout_ms is None:
            # No deadline to watch, so no task of its own: awaiting in place saves a task and two
            # loop turns per step.
            result = await fn(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result
        if is_async:
            pending: asyncio.Future[Any] = asyncio.ensure_future(fn(*args, **kwargs))
        else:
            pending = run_in_thread(fn, *args, **kwargs)
        timeout = None if timeout_ms is None else timeout_ms / 1000
        try:
            done, _ = await asyncio.wait({pending}, timeout=timeout)
        except asyncio.CancelledError:
            # As when the function runs in place: cancelling the step cancels the function.
            pending.cancel()
            raise
        if not done:
            error = StepTimeoutError(
                f"step {name!r} outlived step_timeout ({timeout_ms} ms)", step=name
            )
            assert signal is not None
            signal.fire(error)
            # One loop turn lets a function waiting on its signal see why before it is cancelled.
            await asyncio.sleep(0)
            pending.cancel()
            raise error
        result = pending.result()
        if inspect.isawaitable(result):
            result = await result
        return result


class SyncStep:
    """The blocking ``step`` a plain ``def`` body receives (it runs in a worker thread).

    Each call hands the async :class:`StepRunner` call to the worker's event loop and blocks the
    body's thread until it answers, so both kinds of body share one runner and one set of rules.
    """

    def __init__(self, runner: StepRunner, loop: asyncio.AbstractEventLoop) -> None:
        """Wrap ``runner``, whose coroutines run on ``loop``."""
        self._runner = runner
        self._loop = loop

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def run(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        compensate: Callable[..., Any] | None = None,
        once: bool = False,
    ) -> JSONValue:
        """Blocking :meth:`StepRunner.run`."""
        return self._call(self._runner.run(name, fn, *args, compensate=compensate, once=once))

    def sleep(self, name_or_duration: str | Duration, duration: Duration | None = None) -> None:
        """Blocking :meth:`StepRunner.sleep`."""
        self._call(self._runner.sleep(name_or_duration, duration))

    def sleep_until(self, name: str, when: datetime) -> None:
        """Blocking :meth:`StepRunner.sleep_until`."""
        self._call(self._runner.sleep_until(name, when))

    def invoke(
        self,
        name: str,
        job: JobHandle[Any, Any],
        input: Any,
        *,
        cancel_children: bool = True,
        **enqueue_options: Any,
    ) -> JSONValue:
        """Blocking :meth:`StepRunner.invoke`."""
        return self._call(
            self._runner.invoke(
                name, job, input, cancel_children=cancel_children, **enqueue_options
            )
        )

    def gather(
        self,
        name: str,
        calls: Sequence[tuple[JobHandle[Any, Any], Any]],
        *,
        fail_fast: bool = False,
        cancel_children: bool = True,
        **enqueue_options: Any,
    ) -> list[JSONValue]:
        """Blocking :meth:`StepRunner.gather`."""
        answer: list[JSONValue] = self._call(
            self._runner.gather(
                name,
                calls,
                fail_fast=fail_fast,
                cancel_children=cancel_children,
                **enqueue_options,
            )
        )
        return answer

    def wait_for_event(
        self,
        name: str,
        event: str,
        *,
        schema: Any,
        match: Mapping[str, JSONValue] | None = None,
        timeout: Duration | None = None,
        required: bool = False,
        correlation_key: str | None = None,
    ) -> Any:
        """Blocking :meth:`StepRunner.wait_for_event`."""
        return self._call(
            self._runner.wait_for_event(
                name,
                event,
                schema=schema,
                match=match,
                timeout=timeout,
                required=required,
                correlation_key=correlation_key,
            )
        )


Step = StepRunner
"""The type of the ``step`` argument of an async body."""


def _duration_ms(value: object) -> int:
    try:
        return parse_duration(value, field="duration")  # type: ignore[arg-type]
    except ValueError as exc:
        raise JobOptionsInvalidError(str(exc)) from None


def _check_event_names(step: str, event: object, correlation_key: object) -> None:
    if not isinstance(event, str) or not event or "\x00" in event:
        raise JobOptionsInvalidError(
            f"wait_for_event {step!r}: the event name must be non-empty text without U+0000",
            option="event",
            step=step,
        )
    if correlation_key is not None and (
        not isinstance(correlation_key, str) or "\x00" in correlation_key
    ):
        raise JobOptionsInvalidError(
            f"wait_for_event {step!r}: correlation_key must be text without U+0000",
            option="correlation_key",
            step=step,
        )


def _event_adapter(step: str, schema: Any) -> TypeAdapter[Any]:
    # ``None`` would build an adapter accepting only a null payload, so a forgotten schema would
    # surface as X_JOB_EVENT_INVALID on the first real event instead of at the wait.
    if schema is None:
        raise JobOptionsInvalidError(
            f"wait_for_event {step!r}: schema is required (a pydantic model the payload must fit)",
            option="schema",
            step=step,
        )
    try:
        return TypeAdapter(schema)
    except Exception as exc:
        raise JobOptionsInvalidError(
            f"wait_for_event {step!r}: schema {schema!r} is not a type pydantic can validate "
            f"({type(exc).__name__})",
            option="schema",
            step=step,
        ) from None
