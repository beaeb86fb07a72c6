"""One attempt of one claimed row: parse, check, run the body, decide, settle.

The decision table (``10-core.md`` §3, §5):

==================================  ======================================================
the body...                         the row...
==================================  ======================================================
returned                            ``done`` (ack) — outcome ``completed``
parked (sleep / wait)               ``suspended`` until due, attempt not spent — ``suspended``
raised while the worker drains      ``ready`` now, attempt not spent — ``interrupted``
raised, retryable, attempts left    ``delayed`` by backoff or ``retry_after`` — ``retried``
raised for good                     (compensators run, newest first) then ``dead`` —
                                    ``dead-lettered``, or ``failed`` under
                                    ``Retry(dead_letter=False)`` — ``dropped``
never ran: key busy, ``fail``       ``failed`` with ``X_JOB_KEY_BUSY`` — ``refused``
never ran: over a limit / ``wait``  handed back, attempt not spent — ``deferred``
never ran: rate limited, ``wait``   handed back due when the next token is free, attempt not
                                    spent — ``deferred``
never ran: rate limited, ``fail``   ``X_JOB_RATE_LIMITED`` under the retry policy (attempt
                                    spent) — ``retried``, ``dead-lettered`` or ``dropped``
lost its fleet concurrency slot     handed back, attempt not spent, ``X_JOB_SLOT_LOST`` —
                                    ``interrupted``
cancelled by an operator            untouched (the row is ``cancelled``) — ``cancelled``
lost its claim (lapse)              untouched (someone else owns it) — ``lost``
==================================  ======================================================
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, TypeVar, cast

from jobs_core._settle import SettleRetry
from jobs_core._threads import run_in_thread
from jobs_core.children import Children, publish_settled
from jobs_core.clock import SYSTEM_CLOCK, Clock
from jobs_core.context import CancelSignal, JobContext, JobIds, JobLogger
from jobs_core.driver import (
    EventBus,
    Introspector,
    JobDriver,
    LeaseRequest,
    LeaseStore,
    RateRequest,
    RateStore,
    capability,
)
from jobs_core.errors import (
    CompensationFailedError,
    DrainingError,
    JobCancelledError,
    JobsError,
    JobTimeoutError,
    JobUnknownError,
    KeyBusyError,
    MaxAttemptsError,
    OnSettledFailedError,
    RateLimitedError,
    SlotLostError,
    TenantMismatchError,
    classification_of,
)
from jobs_core.ids import new_id
from jobs_core.job import JobHandle, JobRegistry, Settled
from jobs_core.limits import Concurrency
from jobs_core.rate import WhenLimited
from jobs_core.retry import Retry
from jobs_core.serialization import NotJSONError, to_json_form
from jobs_core.steps import StepRunner, StepSuspended, SyncStep, UnwindReached, error_info
from jobs_core.tenancy import Actor, acting_as
from jobs_core.types import (
    LEASE_LAPSED_FINAL_ATTEMPT,
    PROGRESS_INTERVAL_MS,
    ClaimedJob,
    ErrorInfo,
    JSONValue,
    NackOptions,
    Settle,
)

Outcome = Literal[
    "completed",
    "suspended",
    "retried",
    "dead-lettered",
    "dropped",
    "interrupted",
    "refused",
    "deferred",
    "cancelled",
    "lost",
]

_log = logging.getLogger("jobs.worker")

T = TypeVar("T")

UNKNOWN_JOB_DELAY = "30s"
"""How long a row whose name no module declares waits before its next attempt (a deploy may be
rolling out the module that declares it); it dead-letters when its attempts run out."""

BUSY_RETRY = Retry(backoff="fixed", delay="1s")
"""How a row handed back for a busy key or an in-process limit waits: about 1 s, jittered."""


@dataclass(slots=True)
class AttemptEnv:
    """What every attempt of one worker shares.

    Attributes:
        driver: the driver rows come from.
        registry: the jobs this process knows.
        clock: the worker's clock.
        visibility_timeout_ms: the lease each claim buys (fleet slots expire with it too).
        draining: ``True`` once the worker drains (an unwinding body is then interrupted).
        settle_retry: retries settles and step writes refused with ``X_DRIVER_UNAVAILABLE``
            while the lease can hold (``None``: one try, the failure propagates).
    """

    driver: JobDriver
    registry: JobRegistry
    clock: Clock
    visibility_timeout_ms: int
    draining: bool = False
    settle_retry: SettleRetry | None = None
    events: EventBus | None = field(init=False)
    leases: LeaseStore | None = field(init=False)
    rate: RateStore | None = field(init=False)
    introspect: Introspector | None = field(init=False)
    children: Children | None = field(init=False)

    def __post_init__(self) -> None:
        """Resolve the driver's optional stores once."""
        self.events = capability(self.driver, "events")
        self.leases = capability(self.driver, "leases")
        self.rate = capability(self.driver, "rate")
        self.introspect = capability(self.driver, "introspect")
        store = capability(self.driver, "children")
        self.children = (
            None
            if store is None or self.events is None
            else Children(self.driver, store, self.events, self.introspect)
        )


@dataclass(slots=True)
class Attempt:
    """The live state of one attempt, shared with the worker's heartbeat and drain.

    Attributes:
        job: the claimed row.
        cancel: the attempt's cancel signal.
        runner: its step runner, once the body starts.
        slot: the fleet concurrency slot held, if any.
        rate_limited: the job's ``when_limited`` when its rate bucket refused this attempt a
            token (the worker counts it in ``job_rate_limited_total``); ``None`` otherwise.
        lost: set when a heartbeat found the claim gone.
        slot_lost: set when a heartbeat found the fleet slot gone (the claim is still held, so
            the attempt is handed back, not counted).
        reports: how many ``ctx.progress`` reports the body made (the worker reads it as
            progress, with the step writes, for its stuck-run warning).
        result: the body's return value once it completed.
        error: the failure the row was settled with, once it was.
        settled: set once the row's settle landed or was refused (the attempt no longer owns it;
            a heartbeat answering ``False`` afterwards is not a lost lease).
        body_over: called once when the body completed and only its ``ack`` is left to land (the
            worker lends the slot to the next row meanwhile); not called for a job with an
            ``on_settled`` hook or while a fleet concurrency slot is held; ``None``: nobody
            listens.
    """

    job: ClaimedJob
    cancel: CancelSignal = field(default_factory=CancelSignal)
    runner: StepRunner | None = None
    slot: LeaseRequest | None = None
    rate_limited: WhenLimited | None = None
    lost: bool = False
    slot_lost: bool = False
    reports: int = 0
    settled: bool = False
    result: Any = None
    error: ErrorInfo | None = None
    body_over: Callable[[], None] | None = None

    def stop(self, reason: JobsError, *, abort_writes: bool) -> None:
        """Fire the cancel signal; with ``abort_writes`` also refuse every later step write."""
        self.cancel.fire(reason)
        if abort_writes and self.runner is not None:
            self.runner.abort(reason)


async def execute(env: AttemptEnv, attempt: Attempt) -> Outcome:
    """Run one attempt of a claimed row and settle it; answer the outcome.

    Never raises for a body's failure: every failure becomes a settle. Driver errors propagate
    (the lease then lapses and the row is re-claimed). A child job's ending (a row carrying
    ``parent_run_id``) publishes ``jobs.child.settled``, waking its parent.
    """
    outcome = await _execute(env, attempt)
    job = attempt.job
    if job.parent_run_id is not None and outcome in ENDINGS and env.events is not None:
        await publish_settled(env.events, job.parent_run_id, job.id, _ENDED[outcome])
    return outcome


_ENDED = {"completed": "done", "dead-lettered": "dead", "dropped": "failed", "refused": "failed"}
"""The state a row ends in, by the outcome of its last attempt (``ENDINGS`` only)."""


async def _execute(env: AttemptEnv, attempt: Attempt) -> Outcome:
    job = attempt.job
    handle = env.registry.get(job.name)
    if handle is None:
        error = JobUnknownError(f"no imported module declares job {job.name!r}", job=job.name)
        retry = Retry(attempts=job.max_attempts, backoff="fixed", delay=UNKNOWN_JOB_DELAY)
        return await _fail(env, attempt, retry, error_info(error), "retry")
    try:
        value = handle.parse_input(job.input)
        declared = handle.tenant_of(value)
        if job.tenant_id is not None and declared is not None and job.tenant_id != declared:
            raise TenantMismatchError(
                f"row queued for tenant {job.tenant_id!r} but its input belongs to {declared!r}",
                job=job.name,
                form="row",
            )
    except JobsError as exc:
        refused = await _fail(env, attempt, handle.retry, error_info(exc), "terminal")
        await notify_settled(env, handle, attempt, refused, None, job.tenant_id)
        return refused
    tenant = job.tenant_id or declared
    # The guards here skip awaiting a coroutine that would return at once (most jobs).
    outcome: Outcome | None = None
    if handle.concurrency is not None and env.leases is not None:
        outcome = await _acquire_slot(env, attempt, handle, value)
    if outcome is None:
        try:
            outcome = await _run(env, attempt, handle, value, tenant)
        finally:
            if attempt.slot is not None and env.leases is not None:
                await env.leases.release(attempt.slot.key, attempt.slot.holder)
    if handle.on_settled is not None:
        await notify_settled(env, handle, attempt, outcome, value, tenant)
    return outcome


async def _acquire_slot(
    env: AttemptEnv, attempt: Attempt, handle: JobHandle[Any, Any], value: Any
) -> Outcome | None:
    spec = handle.concurrency
    if spec is None or env.leases is None:
        return None
    if isinstance(spec, Concurrency):
        key, limit, when_busy = (
            f"job-key:{handle.name}:{spec.key(value)}",
            spec.limit,
            spec.when_busy,
        )
    else:
        key, limit, when_busy = f"job:{handle.name}", spec, "wait"
    req = LeaseRequest(key, limit, str(attempt.job.run_id), env.visibility_timeout_ms)
    if await env.leases.acquire(req):
        attempt.slot = req
        return None
    if when_busy == "fail":
        error = error_info(KeyBusyError(f"every slot of {key!r} is taken", key=key))
        opts = NackOptions(attempt.job.fence, error=error, fail=True, count_attempt=False)
        return await _settle(env, attempt, opts, "refused")
    return await hand_back(env.driver, attempt.job, settle_retry=env.settle_retry)


async def _take_token(
    env: AttemptEnv, attempt: Attempt, handle: JobHandle[Any, Any], value: Any
) -> Outcome | None:
    """Take a token of the job's rate bucket; ``None`` when granted, else the settled outcome.

    Taken after the fleet concurrency slot (a refused slot spends no token) and the step load,
    right before the body, so the bucket counts attempts as they start. Refused under ``wait``,
    the row is handed back due exactly when the store says the next token is free (measured on
    the store's clock, like the hand-back's delay, so no worker's clock enters); under ``fail``
    the attempt fails with ``X_JOB_RATE_LIMITED`` and the job's retry policy decides.
    """
    rate = handle.rate_limit
    if rate is None or env.rate is None:
        return None
    key = rate.bucket(handle.name, value)
    wait_ms = await env.rate.take_token(RateRequest(key, rate.limit, rate.window_ms))
    if wait_ms <= 0:
        return None
    attempt.rate_limited = rate.when_limited
    if rate.when_limited == "wait":
        return await hand_back(
            env.driver, attempt.job, delay_ms=wait_ms, settle_retry=env.settle_retry
        )
    error = RateLimitedError(
        f"{handle.name}: the {rate.limit} starts per {rate.per_ms} ms of {key!r} are taken; "
        f"the next token is free in {wait_ms} ms",
        job=handle.name,
        key=key,
        wait_ms=wait_ms,
    )
    return await _fail(env, attempt, handle.retry, error_info(error), "retry")


async def hand_back(
    driver: JobDriver,
    job: ClaimedJob,
    delay_ms: int | None = None,
    *,
    settle_retry: SettleRetry | None = None,
) -> Outcome:
    """Give a claimed row back unrun (attempt not spent), due again in ``delay_ms`` (ms).

    The default (``None``) is about a second (a busy slot), drawn with jitter on every call so
    rows deferred together do not all come back at once; answers ``deferred``, or ``lost`` if
    the claim was no longer held. With ``settle_retry`` (an attempt's, whose heartbeat runs) a
    nack refused with ``X_DRIVER_UNAVAILABLE`` is sent again while the lease can hold.

    Raises:
        DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` without ``settle_retry``; the lease
            lapses instead.
        SettleAbandonedError: with ``settle_retry``, once the lease was surely gone.
    """
    delay = BUSY_RETRY.delay_after_ms(1) if delay_ms is None else delay_ms
    opts = NackOptions(job.fence, delay_ms=delay, count_attempt=False)
    call = functools.partial(driver.nack, job.id, opts)
    landed = await (call() if settle_retry is None else settle_retry.run(job, "deferred", call))
    return "deferred" if landed else "lost"


async def _run(
    env: AttemptEnv, attempt: Attempt, handle: JobHandle[Any, Any], value: Any, tenant: str | None
) -> Outcome:
    job = attempt.job
    fence = job.fence  # a property that builds a Fence per read
    steps = env.driver.steps
    records = await steps.load(job.run_id)
    if handle.rate_limit is not None and env.rate is not None:
        # The token is the last thing before the body: what the bucket counts is the start.
        limited = await _take_token(env, attempt, handle, value)
        if limited is not None:
            return limited
    runner = StepRunner(
        store=steps if env.settle_retry is None else env.settle_retry.steps(steps, job),
        job_id=job.id,
        fence=fence,
        run_id=job.run_id,
        job_name=job.name,
        records=records,
        cancel=attempt.cancel,
        clock=env.clock,
        events=env.events,
        step_timeout_ms=handle.step_timeout_ms,
        event_poll_ms=handle.event_poll_ms,
        compensates=handle.compensates,
        children=env.children,
    )
    attempt.runner = runner
    if attempt.cancel.is_set:
        runner.abort(attempt.cancel.reason or DrainingError())
    if handle.compensates and not runner.unwinding and job.attempt > handle.retry.attempts:
        await runner.begin_unwind(ErrorInfo(LEASE_LAPSED_FINAL_ATTEMPT, MaxAttemptsError.code))
    ctx = JobContext(
        job_id=job.id,
        run_id=job.run_id,
        name=job.name,
        queue=job.queue,
        attempt=job.attempt,
        final_attempt=job.attempt >= handle.retry.attempts,
        tenant_id=tenant,
        cancel=attempt.cancel,
        log=JobLogger(_job_logger(job.name), JobIds(job.id, job.run_id, job.attempt)),
        _report=None if env.introspect is None else _ProgressReporter(env, env.introspect, attempt),
    )
    started = env.clock.monotonic()
    try:
        result = await _body(env, attempt, handle, value, runner, ctx, tenant)
    except StepSuspended:
        return await _park(env, attempt, runner)
    except UnwindReached:
        return await _unwind(env, attempt, handle, runner)
    except Exception as exc:
        stopped = await _stopped(env, attempt) if attempt.cancel.is_set else None
        if stopped is not None:
            return stopped
        if runner.unwinding:
            return await _unwind(env, attempt, handle, runner)
        return await _after_failure(env, attempt, handle, runner, exc)
    stopped = await _stopped(env, attempt) if attempt.cancel.is_set else None
    if stopped is not None:
        return stopped
    if runner.suspension is not None:
        return await _park(env, attempt, runner)
    if runner.unwinding:
        return await _unwind(env, attempt, handle, runner)
    attempt.result = result
    try:
        stored: JSONValue = to_json_form(result)
    except NotJSONError:
        _log.warning(
            "jobs.result.unserializable",
            extra={"event": "jobs.result.unserializable", "job": job.name, "job_id": str(job.id)},
        )
        stored = None
    settle = Settle(fence, result=stored, duration_ms=(env.clock.monotonic() - started) * 1000)
    # The slot stays taken for an on_settled hook (user code that runs after the ack) and while
    # a fleet concurrency slot is held (released after the ack: the next row would meet it).
    if attempt.body_over is not None and handle.on_settled is None and attempt.slot is None:
        attempt.body_over()
    landed = await _settling(
        env, job, "completed", functools.partial(env.driver.ack, job.id, settle)
    )
    attempt.settled = True
    return "completed" if landed else _lost(job, "ack")


async def _body(
    env: AttemptEnv,
    attempt: Attempt,
    handle: JobHandle[Any, Any],
    value: Any,
    runner: StepRunner,
    ctx: JobContext,
    tenant: str | None,
) -> Any:
    """Run the body (:func:`call_body`), then write its last progress report if one is pending.

    The write lands before the settle, so the settled row carries the body's last report.
    """
    try:
        return await call_body(env, handle, value, runner, ctx, tenant, handle.timeout_ms)
    finally:
        report = ctx._report
        if isinstance(report, _ProgressReporter) and not attempt.lost:
            await report.flush()


async def _stopped(env: AttemptEnv, attempt: Attempt) -> Outcome | None:
    """Answer the outcome of an attempt an operator cancelled or whose fleet slot was lost.

    ``None`` when neither happened (the body's own result or error decides). A cancelled row is
    left as the operator left it (outcome ``cancelled``); after a lost slot the row is handed
    back, the attempt not spent, with ``X_JOB_SLOT_LOST`` as its error (outcome
    ``interrupted``): the body ran without the slot, so its result cannot stand.
    """
    reason = attempt.cancel.reason
    if attempt.lost and isinstance(reason, JobCancelledError):
        return "cancelled"
    if attempt.slot_lost and isinstance(reason, SlotLostError) and not attempt.lost:
        opts = NackOptions(
            attempt.job.fence,
            error=ErrorInfo(reason.message, reason.code),
            delay_ms=BUSY_RETRY.delay_after_ms(1),
            count_attempt=False,
        )
        return await _settle(env, attempt, opts, "interrupted")
    return None


async def call_body(
    env: AttemptEnv,
    handle: JobHandle[Any, Any],
    value: Any,
    runner: StepRunner,
    ctx: JobContext,
    tenant: str | None,
    timeout_ms: int | None,
) -> Any:
    """Run the body under the job's tenant, in a thread for a plain ``def``, within its timeout.

    At the deadline the cancel signal fires with ``X_JOB_TIMEOUT`` and step writes are refused,
    then :class:`~jobs_core.errors.JobTimeoutError` is raised; a body that finishes later is
    logged ``jobs.timeout.abandoned``. Cancelling the caller (a drain past its budget) cancels an
    async body too.
    """
    loop = asyncio.get_running_loop()
    with acting_as(_actor(handle.name, tenant)):
        if handle.is_async:
            if timeout_ms is None:
                # No deadline to watch: the body runs in the attempt's own task (a task of its
                # own would cost two more loop turns per job).
                return await _guarded(handle.body(value, runner, ctx))
            pending: asyncio.Future[Any] = asyncio.ensure_future(
                _guarded(handle.body(value, runner, ctx))
            )
        else:
            pending = run_in_thread(_guarded_sync, handle.body, value, SyncStep(runner, loop), ctx)
    try:
        done, _ = await asyncio.wait(
            {pending}, timeout=None if timeout_ms is None else timeout_ms / 1000
        )
    except asyncio.CancelledError:
        pending.cancel()
        raise
    if not done:
        error = JobTimeoutError(f"{handle.name} outlived its timeout ({timeout_ms} ms)")
        ctx.cancel.fire(error)
        runner.abort(error)
        pending.add_done_callback(functools.partial(_abandoned, handle.name, ctx.job_id))
        raise error
    return pending.result()


class BodyExitError(Exception):
    """A body raised ``SystemExit``, ``KeyboardInterrupt`` or another non-``Exception``.

    Such an error must fail the attempt, not the worker process that runs other jobs too.
    """


def _exit_error(exc: BaseException) -> BodyExitError:
    return BodyExitError(f"the body raised {type(exc).__name__}: {exc}")


async def _guarded(body: Coroutine[Any, Any, Any]) -> Any:
    try:
        return await body
    except (asyncio.CancelledError, GeneratorExit, StepSuspended, UnwindReached, Exception):
        # GeneratorExit: the coroutine of an abandoned (timed-out) body is being closed.
        raise
    except BaseException as exc:
        raise _exit_error(exc) from None


def _guarded_sync(body: Callable[..., Any], *args: Any) -> Any:
    try:
        return body(*args)
    except (StepSuspended, UnwindReached, Exception):
        raise
    except BaseException as exc:
        raise _exit_error(exc) from None


def _abandoned(name: str, job_id: Any, _future: asyncio.Future[Any]) -> None:
    _log.warning(
        "jobs.timeout.abandoned",
        extra={"event": "jobs.timeout.abandoned", "job": name, "job_id": str(job_id)},
    )


@functools.cache
def _job_logger(name: str) -> logging.Logger:
    """Answer the logger of job ``name`` (one per declared job, so the cache stays small)."""
    return logging.getLogger(f"jobs.job.{name}")


@functools.lru_cache(maxsize=4096)
def _actor(name: str, tenant: str | None) -> Actor:
    """Answer the actor a body of job ``name`` acts as for ``tenant`` (immutable, so shared)."""
    return Actor(id=f"job:{name}", org_id=tenant)


class _ProgressReporter:
    """``JobContext.progress``'s writer: one write per ``PROGRESS_INTERVAL_MS``, the latest wins.

    A report inside the interval is kept and written when the interval ends, and :meth:`flush`
    writes a pending one before the attempt settles, so the last report is never lost. Writes
    run one after another, so an older report never lands after a newer one. Callable from the
    loop or from a sync body's thread; the writes run on the worker's loop.
    """

    __slots__ = (
        "_armed",
        "_attempt",
        "_clock",
        "_closed",
        "_introspect",
        "_last",
        "_latest",
        "_loop",
        "_pending",
        "_timer",
        "_writing",
    )

    def __init__(self, env: AttemptEnv, introspect: Introspector, attempt: Attempt) -> None:
        """Report for ``attempt``'s row through ``introspect`` on the running loop."""
        self._loop = asyncio.get_running_loop()
        self._clock = env.clock
        self._introspect = introspect
        self._attempt = attempt
        self._last: float | None = None
        self._latest: JSONValue = None
        # A report not written yet; a write or timer is scheduled (``_armed``) to take it.
        self._pending = False
        self._armed = False
        self._closed = False
        self._timer: asyncio.TimerHandle | None = None
        self._writing: asyncio.Task[None] | None = None

    def __call__(self, progress: JSONValue) -> None:
        """Keep ``progress`` as the latest report; schedule its write unless one is scheduled."""
        self._attempt.reports += 1
        self._latest = progress
        self._pending = True
        if self._armed:
            return
        self._armed = True
        interval = PROGRESS_INTERVAL_MS / 1000
        since = None if self._last is None else self._clock.monotonic() - self._last
        delay = 0.0 if since is None else max(0.0, interval - since)
        self._loop.call_soon_threadsafe(self._arm, delay)

    def _arm(self, delay: float) -> None:
        if delay <= 0:
            self._fire()
        else:
            self._timer = self._loop.call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        # Cleared before the report is read: a report made meanwhile arms a write of its own.
        self._armed = False
        if not self._pending or self._closed:
            return
        self._pending = False
        self._last = self._clock.monotonic()
        self._writing = self._loop.create_task(self._write(self._writing, self._latest))

    async def _write(self, previous: asyncio.Task[None] | None, progress: JSONValue) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        job = self._attempt.job
        try:
            await self._introspect.record_progress(job.id, job.fence, progress)
        except Exception:
            _log.warning("jobs.progress.failed", extra={"event": "jobs.progress.failed"})

    async def flush(self) -> None:
        """Write a pending report now and wait for the writes in flight; later reports are dropped.

        Never raises: a failed write is logged ``jobs.progress.failed``.
        """
        if self._timer is not None:
            self._timer.cancel()
        if self._pending:
            self._fire()
        self._closed = True
        if self._writing is not None:
            await asyncio.wait([self._writing])


async def _park(env: AttemptEnv, attempt: Attempt, runner: StepRunner) -> Outcome:
    assert runner.suspension is not None
    # The clock question is part of the park: a blip here must not strand the parked run.
    now: datetime = await _settling(env, attempt.job, "suspended", env.driver.steps.now)
    delay_ms = max(0, int((runner.suspension.wake_at - now).total_seconds() * 1000))
    opts = NackOptions(attempt.job.fence, delay_ms=delay_ms, park=True, count_attempt=False)
    return await _settle(env, attempt, opts, "suspended")


async def _after_failure(
    env: AttemptEnv,
    attempt: Attempt,
    handle: JobHandle[Any, Any],
    runner: StepRunner,
    exc: Exception,
) -> Outcome:
    job = attempt.job
    reason = attempt.cancel.reason
    if isinstance(reason, DrainingError) and env.draining:
        opts = NackOptions(job.fence, error=error_info(exc), count_attempt=False)
        return await _settle(env, attempt, opts, "interrupted")
    if attempt.lost:
        return _lost(job, "fail")
    info = error_info(exc)
    kind = classification_of(exc)
    retry_after = _retry_after_ms(exc) if kind == "retry_after" else None
    del exc
    if kind != "terminal" and job.attempt < handle.retry.attempts:
        return await _fail(env, attempt, handle.retry, info, kind, retry_after)
    if handle.compensates:
        await runner.begin_unwind(info if kind == "terminal" else _ran_out(job, info))
        return await _unwind(env, attempt, handle, runner)
    return await _fail(env, attempt, handle.retry, info, kind)


def _retry_after_ms(exc: BaseException) -> int | None:
    meta = getattr(exc, "meta", None)
    seconds = meta.get("retry_after_seconds") if isinstance(meta, dict) else None
    if isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds >= 0:
        return int(seconds * 1000)
    return None


async def _fail(
    env: AttemptEnv,
    attempt: Attempt,
    retry: Retry,
    info: ErrorInfo,
    kind: str,
    retry_after_ms: int | None = None,
) -> Outcome:
    """Settle a failed attempt: retry while attempts remain, else dead-letter or drop."""
    job = attempt.job
    if kind != "terminal" and job.attempt < min(retry.attempts, job.max_attempts):
        if retry_after_ms is not None:
            delay = retry.after_ms(retry_after_ms)
        else:
            delay = retry.delay_after_ms(job.attempt)
        return await _settle(
            env, attempt, NackOptions(job.fence, error=info, delay_ms=delay), "retried"
        )
    return await _bury(env, attempt, retry, info if kind == "terminal" else _ran_out(job, info))


def _ran_out(job: ClaimedJob, last: ErrorInfo) -> ErrorInfo:
    """Answer the error of a row buried because its attempts ran out (``X_JOB_MAX_ATTEMPTS``).

    The last attempt's own code and message follow in the text (cut to the stored 2,000
    characters); its stack is kept as the row's stack.
    """
    own = f"{last.code}: {last.message}" if last.code else last.message
    message = f"attempts ran out after attempt {job.attempt}; the last failed with {own}"
    return ErrorInfo(message[:2_000], MaxAttemptsError.code, last.stack)


async def _bury(env: AttemptEnv, attempt: Attempt, retry: Retry, info: ErrorInfo) -> Outcome:
    fence = attempt.job.fence
    if retry.dead_letter:
        opts = NackOptions(fence, error=info, dead_letter=True)
        return await _settle(env, attempt, opts, "dead-lettered")
    return await _settle(env, attempt, NackOptions(fence, error=info, fail=True), "dropped")


async def _unwind(
    env: AttemptEnv, attempt: Attempt, handle: JobHandle[Any, Any], runner: StepRunner
) -> Outcome:
    job = attempt.job
    try:
        await runner.compensate_all()
    except Exception as exc:
        info = error_info(exc)
        if job.attempt < job.max_attempts:
            opts = NackOptions(job.fence, error=info, delay_ms=handle.retry.delay_after_ms(1))
            return await _settle(env, attempt, opts, "retried")
        failed = CompensationFailedError(
            f"a compensator of {job.name} kept failing: {info.message}", job=job.name
        )
        final = ErrorInfo(failed.message, failed.code, info.stack)
        return await _settle(
            env, attempt, NackOptions(job.fence, error=final, dead_letter=True), "dead-lettered"
        )
    return await _bury(env, attempt, handle.retry, runner.unwind_error())


async def _settle(
    env: AttemptEnv, attempt: Attempt, opts: NackOptions, outcome: Outcome
) -> Outcome:
    """Nack fenced on the attempt's claim; answer ``outcome``, or ``lost`` if the fence failed."""
    job = attempt.job
    landed = await _settling(env, job, outcome, functools.partial(env.driver.nack, job.id, opts))
    attempt.settled = True
    if not landed:
        return _lost(job, outcome)
    attempt.error = opts.error
    return outcome


async def _settling(
    env: AttemptEnv, job: ClaimedJob, outcome: Outcome, call: Callable[[], Awaitable[T]]
) -> T:
    """Send a fenced settle (or the question it needs) once, or through the worker's retry."""
    if env.settle_retry is None:
        return await call()
    return await env.settle_retry.run(job, outcome, call)


def _lost(job: ClaimedJob, during: str) -> Outcome:
    _log.warning(
        "jobs.settle.fenced",
        extra={
            "event": "jobs.settle.fenced",
            "job": job.name,
            "job_id": str(job.id),
            "claim": job.claim,
            "during": during,
        },
    )
    return "lost"


ENDINGS: frozenset[str] = frozenset({"completed", "dead-lettered", "dropped", "refused"})
"""The outcomes ``on_settled`` is told about (a row that ended)."""

ON_SETTLED_TRIES = 3
"""How many times a failing ``on_settled`` hook is called within its timeout."""


async def notify_settled(
    env: AttemptEnv,
    handle: JobHandle[Any, Any],
    attempt: Attempt,
    outcome: Outcome,
    value: Any,
    tenant: str | None,
) -> None:
    """Tell the job's ``on_settled`` hook about an ending, once, after the row settled.

    Up to :data:`ON_SETTLED_TRIES` tries within ``on_settled_timeout``, under the job's tenant; a
    hook that keeps failing is logged ``jobs.on-settled.failed`` (``X_JOB_ON_SETTLED_FAILED``) and
    never changes the row. Nothing is persisted, so a crash between the settle and the hook means
    the hook is not told (at most once per ending).
    """
    hook = handle.on_settled
    if hook is None or outcome not in ENDINGS:
        return
    job = attempt.job
    error = attempt.error
    settled = Settled(
        job_id=job.id,
        run_id=job.run_id,
        name=job.name,
        outcome=cast(Any, outcome),
        input=value,
        result=attempt.result if outcome == "completed" else None,
        error=None if error is None else error.message,
        code=None if error is None else error.code,
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + handle.on_settled_timeout_ms / 1000
    last = ""
    for _ in range(ON_SETTLED_TRIES):
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        try:
            with acting_as(_actor(handle.name, tenant)):
                await asyncio.wait_for(_call_hook(env, hook, settled), remaining)
            return
        except Exception as exc:
            last = f"{type(exc).__name__}: {exc}"
    failure = OnSettledFailedError(f"on_settled of {job.name} failed: {last}", job=job.name)
    _log.error(
        "jobs.on-settled.failed",
        extra={
            "event": "jobs.on-settled.failed",
            "code": failure.code,
            "job": job.name,
            "job_id": str(job.id),
            "outcome": outcome,
            "error": last,
        },
    )


async def _call_hook(env: AttemptEnv, hook: Callable[[Settled], Any], settled: Settled) -> None:
    if inspect.iscoroutinefunction(hook):
        await hook(settled)
        return
    result = await run_in_thread(hook, settled)
    if inspect.isawaitable(result):
        await result


async def run_inline(handle: JobHandle[Any, Any], input: Any, driver: JobDriver) -> Any:
    """Run ``handle``'s body through the step runner with no row (``JobHandle.run_inline``).

    Sleeps and waits are waited out in real time and the body replays; errors propagate.
    """
    value = handle.parse_input(input)
    tenant = handle.tenant_of(value)
    run_id = new_id()
    env = AttemptEnv(driver, handle.registry, _clock_of(driver), 30_000)
    while True:
        cancel = CancelSignal()
        runner = StepRunner(
            store=driver.steps,
            job_id=None,
            fence=None,
            run_id=run_id,
            job_name=handle.name,
            records=await driver.steps.load(run_id),
            cancel=cancel,
            clock=env.clock,
            events=env.events,
            step_timeout_ms=handle.step_timeout_ms,
            event_poll_ms=handle.event_poll_ms,
            compensates=handle.compensates,
        )
        ctx = JobContext(
            job_id=None,
            run_id=run_id,
            name=handle.name,
            queue=handle.queue,
            attempt=1,
            final_attempt=True,
            tenant_id=tenant,
            cancel=cancel,
            log=JobLogger(logging.getLogger(f"jobs.job.{handle.name}"), {"run_id": str(run_id)}),
        )
        try:
            return await call_body(env, handle, value, runner, ctx, tenant, handle.timeout_ms)
        except StepSuspended as suspended:
            now = await driver.steps.now()
            await asyncio.sleep(max(0.0, (suspended.wake_at - now).total_seconds()))


def _clock_of(driver: JobDriver) -> Clock:
    clock = getattr(driver, "clock", None)
    return clock if isinstance(clock, Clock) else SYSTEM_CLOCK
