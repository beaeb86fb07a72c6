"""The driver protocol: the one seam between a job's code and a backend.

A driver implements :class:`JobDriver` (required) and declares in ``capabilities`` which optional
stores it carries (``introspect``, ``leases``, ``events``, ``wake``, ...). Core code reaches an
optional store only through :func:`capability` / :func:`require_capability`, so "not supported"
is handled the same way everywhere: absent capabilities degrade as documented, or raise
``X_NOT_IMPLEMENTED``.

Drivers import this module and :mod:`jobs_core.types` and nothing from the worker, the step runner
or the facade. Every method takes at most two arguments besides ``self``; anything larger is a
frozen params dataclass so adding a field never breaks a third-party driver.

Drivers are found by URL scheme through the ``jobs.drivers`` entry-point group
(:func:`open_driver`); a third party ships one with no change here and proves it with the
``jobs-conformance`` suite.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit
from uuid import UUID

from jobs_core.errors import (
    DriverRequestInvalidError,
    DriverUnavailableError,
    DriverUnknownError,
    JobRunIdTakenError,
    NotImplementedByDriverError,
)
from jobs_core.priority import PRIORITY_MAX, PRIORITY_MIN
from jobs_core.rate import MAX_RATE_LIMIT, MAX_RATE_PER_MS
from jobs_core.serialization import text_problem
from jobs_core.types import (
    LIVE_STATES,
    BackfillPass,
    BackfillProgress,
    BackfillQuery,
    BackfillStart,
    BackfillStatus,
    BulkResult,
    ClaimedJob,
    ClaimRequest,
    CounterBucket,
    EnqueueRequest,
    EnqueueResult,
    Fence,
    JobFilter,
    JobInfo,
    JobPage,
    JSONValue,
    NackOptions,
    OutboxClaim,
    OutboxRow,
    QueueStats,
    RetentionRequest,
    Settle,
    StepRecord,
    StepWrite,
    StoredEvent,
    TaskFire,
    TaskFireRecord,
    WorkerInfo,
)

CAPABILITIES: tuple[str, ...] = (
    "introspect",
    "leases",
    "events",
    "wake",
    "outbox",
    "backfills",
    "scheduler_state",
    "leader",
    "workers",
    "counters",
    "retention",
    "priority",
    "debounce",
    "children",
    "rate",
)
"""Every optional capability a driver may declare: a store's attribute name, or a flag."""

FLAG_CAPABILITIES: frozenset[str] = frozenset({"priority", "debounce"})
"""Capabilities that are behaviour of ``enqueue``/``claim``, not a store: ``priority`` (the claim
takes lower ``EnqueueRequest.priority`` first within a queue, FIFO within one priority) and
``debounce`` (``EnqueueRequest.debounce_ms`` replaces a waiting row's input and pushes its run
time out). :func:`capability` answers ``True`` for a declared flag."""


def check_request_capabilities(driver: JobDriver, req: EnqueueRequest) -> None:
    """Refuse a request that needs a flag capability ``driver`` does not declare.

    Called before a request reaches ``driver.enqueue``/``enqueue_many``, so a driver that does
    not know a field never drops it silently.

    Raises:
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` for a non-zero ``priority`` without
            the ``priority`` capability, or a ``debounce_ms`` without ``debounce``.
    """
    if req.priority and "priority" not in driver.capabilities:
        raise NotImplementedByDriverError(
            f"priority={req.priority}: the {driver.name} driver does not carry the 'priority' "
            "capability",
            driver=driver.name,
            capability="priority",
        )
    if req.debounce_ms is not None and "debounce" not in driver.capabilities:
        raise NotImplementedByDriverError(
            f"debounce: the {driver.name} driver does not carry the 'debounce' capability",
            driver=driver.name,
            capability="debounce",
        )


def check_enqueue_request(req: EnqueueRequest) -> None:
    """Refuse a request no driver can store: every driver calls this before writing anything.

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty ``name``,
            ``queue`` or ``idempotency_key`` (all named in ``fields``), ``max_attempts`` below 1,
            or text holding U+0000 or a lone surrogate (Postgres refuses both; no UTF-8 encodes
            a surrogate, so Redis's client could not send it), naming the field; a
            ``priority`` outside ``PRIORITY_MIN..PRIORITY_MAX`` or a ``debounce_ms`` below 1.
    """
    # One string, one scan: the common case (plain ASCII text) costs ~0.1 µs.
    joined = (
        f"{req.name}{req.queue}{req.idempotency_key}{req.tenant_id or ''}"
        f"{req.enqueued_by or ''}{req.traceparent or ''}{req.order_key or ''}"
    )
    if (
        req.name
        and req.queue
        and req.idempotency_key
        and req.max_attempts >= 1
        and PRIORITY_MIN <= req.priority <= PRIORITY_MAX
        and (req.debounce_ms is None or req.debounce_ms > 0)
        and joined.isascii()
        and "\x00" not in joined
    ):
        return
    empty = [
        what
        for what, value in (
            ("name", req.name),
            ("queue", req.queue),
            ("idempotency_key", req.idempotency_key),
        )
        if not value
    ]
    if empty:
        raise DriverRequestInvalidError(
            f"an enqueue needs a non-empty {', '.join(empty)}", fields=empty, job=req.name
        )
    if req.max_attempts < 1:
        raise DriverRequestInvalidError(
            f"max_attempts must be >= 1, got {req.max_attempts}", job=req.name
        )
    if not PRIORITY_MIN <= req.priority <= PRIORITY_MAX:
        raise DriverRequestInvalidError(
            f"priority must be within {PRIORITY_MIN}..{PRIORITY_MAX}, got {req.priority}",
            field="priority",
            job=req.name,
        )
    if req.debounce_ms is not None and req.debounce_ms <= 0:
        raise DriverRequestInvalidError(
            f"debounce_ms must be > 0, got {req.debounce_ms}", field="debounce_ms", job=req.name
        )
    for what, text in (
        ("name", req.name),
        ("queue", req.queue),
        ("idempotency_key", req.idempotency_key),
        ("tenant_id", req.tenant_id),
        ("enqueued_by", req.enqueued_by),
        ("traceparent", req.traceparent),
        ("order_key", req.order_key),
    ):
        problem = None if text is None else text_problem(text)
        if problem is not None:
            raise DriverRequestInvalidError(f"{what} {problem}", field=what)


def check_run_ids(reqs: Sequence[EnqueueRequest]) -> None:
    """Refuse a batch in which two jobs share a run id: every driver calls this in ``enqueue_many``.

    A run id belongs to one job (its steps are keyed by it); the same id twice in one batch (a
    re-publish) is one job, not a reuse.

    Raises:
        JobRunIdTakenError: ``X_JOB_RUN_ID_TAKEN`` naming both job ids.
    """
    if len(reqs) < 2:
        return
    owners: dict[UUID, UUID] = {}
    for req in reqs:
        owner = owners.setdefault(req.run_id, req.id)
        if owner != req.id:
            raise run_id_taken(req, owner)


def check_task_name(task: str) -> str:
    """Answer ``task`` if it is a usable task name: every ``SchedulerState`` call checks it.

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a name that is not
            non-empty text.
    """
    if not isinstance(task, str) or not task:
        raise DriverRequestInvalidError("a task name must be non-empty text", task=repr(task))
    return task


def check_watermark_forward(
    task: str, expected: datetime | None, moved: datetime, what: str
) -> None:
    """Refuse a watermark move to ``moved`` that is not after ``expected`` (never backwards).

    Every ``SchedulerState.fire`` and ``advance`` calls it with timezone-aware instants.

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` naming the task and both
            instants.
    """
    if expected is not None and moved <= expected:
        raise DriverRequestInvalidError(
            f"task {task!r}: {what} {moved.isoformat()} is not after the watermark "
            f"{expected.isoformat()} it expects; a watermark never moves backwards",
            task=task,
        )


def run_id_taken(req: EnqueueRequest, holder: UUID | str) -> JobRunIdTakenError:
    """Answer the refusal of ``req``, whose run id the job ``holder`` holds or held."""
    return JobRunIdTakenError(
        f"{req.name}: run id {req.run_id} belongs to job {holder}, not to the new job {req.id}; "
        "omit run_id= to mint one",
        job=req.name,
        job_id=str(req.id),
        run_id=str(req.run_id),
        holder=str(holder),
    )


@runtime_checkable
class StepStore(Protocol):
    """Step records, kept with the queue (one store, one transaction boundary).

    Every write is fenced: it lands only while the job row is ``running`` under the write's
    :class:`~jobs_core.types.Fence` (a ``run_inline`` write carries no fence and always lands).
    """

    async def load(self, run_id: UUID) -> list[StepRecord]:
        """Answer every step of a run, in ``seq`` order (empty for a new run)."""
        ...

    async def write(self, write: StepWrite) -> bool:
        """Insert or replace one step record (by ``run_id`` and name).

        The store assigns ``seq`` on first insert (one past the run's highest seq) and keeps
        it on replacement. Answers ``False``, writing nothing, when the fence does not hold.
        """
        ...

    async def now(self) -> datetime:
        """Answer the store's own current instant (UTC): sleeps and waits are measured on it."""
        ...


@runtime_checkable
class JobDriver(Protocol):
    """The required surface of every backend.

    Attributes:
        name: a short name (``"memory"``, ``"postgresql"``, ...).
        capabilities: the optional capabilities carried (a subset of :data:`CAPABILITIES`); for
            each, an attribute of that name holds the store.
        steps: the step store.
    """

    name: str
    capabilities: frozenset[str]
    steps: StepStore

    async def enqueue(self, req: EnqueueRequest) -> EnqueueResult:
        """Queue one row.

        One LIVE row per ``(name, tenant_id or '', idempotency_key)``: while one is live, answer
        its ids with ``deduped=True`` and insert nothing. A request whose ``id`` names an existing
        row (live or finished) answers that row with ``deduped=True``. A row with ``run_at`` (or
        ``delay_ms``) in the future is ``delayed``, else ``ready``; a past ``run_at`` is due now.
        A run id belongs to one job: a request that would insert a row whose ``run_id`` another
        row holds (live or finished) is refused.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``, nothing was queued.
            JobRunIdTakenError: ``X_JOB_RUN_ID_TAKEN`` (see :func:`run_id_taken`), nothing
                was queued.
        """
        ...

    async def enqueue_many(self, reqs: Sequence[EnqueueRequest]) -> list[EnqueueResult]:
        """Queue many rows with :meth:`enqueue`'s semantics, in one round trip per 1,000.

        Answers in input order; a later request in the batch whose key matches an earlier one
        answers the earlier row with ``deduped=True``. All or none: a request refused (its run
        id taken, see :func:`check_run_ids`) queues nothing of the batch.
        """
        ...

    async def claim(self, req: ClaimRequest) -> list[ClaimedJob]:
        """Lease up to ``req.limit`` due rows from ``req.queues`` to ``req.worker_id``.

        Takes ``ready``/``delayed``/``suspended`` rows whose ``run_at`` has passed and ``running``
        rows whose lease lapsed (the lapsed attempt is counted), oldest ``run_at`` first; skips
        paused queues; increments each row's ``claim`` ordinal. A lapsed row already at its final
        attempt is buried instead (``dead`` with ``LEASE_LAPSED_FINAL_ATTEMPT``, or ``failed`` if
        its name is in ``drop_exhausted``) and reported to ``on_exhausted``.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty queue list or a
                limit below 1.
        """
        ...

    async def ack(self, job_id: UUID, by: Settle) -> bool:
        """Settle a row ``done``; fenced on ``state='running'`` and ``by.fence``.

        Answers ``False`` (changing nothing) when someone else owns the row.
        """
        ...

    async def nack(self, job_id: UUID, opts: NackOptions) -> bool:
        """Settle a row in :func:`~jobs_core.types.nack_state` of ``opts``; fenced like :meth:`ack`.

        ``count_attempt`` decides whether the attempt is spent (a park never spends one);
        ``delay_ms`` sets ``run_at`` for
        ``ready``/``delayed``/``suspended``.
        """
        ...

    async def heartbeat(self, job_id: UUID, fence: Fence, visibility_timeout_ms: int) -> bool:
        """Renew a lease to now plus ``visibility_timeout_ms``; fenced like :meth:`ack`.

        Answers ``False`` when the row was cancelled or its claim lost: the worker then fires the
        body's cancel signal.
        """
        ...

    async def stats(self) -> list[QueueStats]:
        """Answer counts per queue (see :class:`~jobs_core.types.QueueStats`), sorted by queue."""
        ...

    async def demand(self) -> dict[str, int]:
        """Answer, per queue, rows running under a live lease plus rows due and claimable.

        Paused queues count only their running rows. This is what an autoscaler reads.
        """
        ...

    def describe(self) -> dict[str, Any]:
        """Answer a JSON-able description: ``name``, ``capabilities`` and driver details."""
        ...

    async def close(self) -> None:
        """Release connections; the driver is unusable afterwards."""
        ...


@runtime_checkable
class Introspector(Protocol):
    """The operator surface over one driver's rows (``40-operator.md``)."""

    async def get(self, job_id: UUID) -> JobInfo | None:
        """Answer one job with its step trace, or ``None`` if no row has that id."""
        ...

    async def list(self, flt: JobFilter) -> JobPage:
        """Answer one page of jobs, newest first (``created_at``, then id).

        Raises:
            JobPageInvalidError: ``X_JOB_PAGE_INVALID`` for ``limit`` outside 1..200 or a cursor
                this listing did not issue.
        """
        ...

    async def cancel(self, job_id: UUID, reason: str) -> JobInfo:
        """Stop a live job.

        A queued one is ``cancelled`` now; a running one too, and its next heartbeat answers
        ``False`` so the body's cancel signal fires.

        Raises:
            JobNotFoundError: ``X_JOB_NOT_FOUND``.
            JobNotCancellableError: ``X_JOB_NOT_CANCELLABLE`` for a finished row.
        """
        ...

    async def resolve_step(self, job_id: UUID, step: str, resolution: StepResolution) -> None:
        """Settle an ``X_STEP_OUTCOME_UNKNOWN`` ``once`` step.

        ``ran`` stores it completed with ``output``; not ``ran`` deletes it so the next attempt
        runs it.

        Raises:
            JobNotFoundError: ``X_JOB_NOT_FOUND``.
            StepNotResolvableError: ``X_STEP_NOT_RESOLVABLE`` unless the step is a ``once`` step
                in ``started``.
        """
        ...

    async def record_progress(self, job_id: UUID, fence: Fence, progress: JSONValue) -> bool:
        """Store a running job's progress; fenced like an ack."""
        ...

    async def pause_queue(self, queue: str) -> None:
        """Stop every worker claiming from ``queue`` (enqueues still land)."""
        ...

    async def resume_queue(self, queue: str) -> None:
        """Let workers claim from ``queue`` again."""
        ...

    # ``builtins.list``: inside this class body ``list`` names the method above.
    async def paused_queues(self) -> builtins.list[str]:
        """Answer the paused queues, sorted."""
        ...

    async def requeue(self, job_id: UUID, from_step: str | None = None) -> JobInfo:
        """Queue a FINISHED job again as a new attempt budget of the same run.

        ``from_step`` deletes that step and every later one (by ``seq``) in the same write, so the
        run replays from there; without it every step is kept (compensators too, so a dead
        saga's unwind is not repeated). The row becomes ``ready`` with ``attempt`` 0.

        Raises:
            JobNotFoundError: ``X_JOB_NOT_FOUND``.
            JobNotRequeueableError: ``X_JOB_NOT_REQUEUEABLE`` for a live row.
            JobDuplicateError: ``X_JOB_DUPLICATE`` when another live row holds its key.
        """
        ...

    async def remove(self, job_id: UUID) -> None:
        """Delete a job and its steps.

        Raises:
            JobNotFoundError: ``X_JOB_NOT_FOUND``.
            JobNotRemovableError: ``X_JOB_NOT_REMOVABLE`` for a running row.
        """
        ...

    async def promote(self, job_id: UUID) -> JobInfo:
        """Make a row waiting on ``run_at`` (``delayed`` or ``suspended``) due now.

        Raises:
            JobNotFoundError: ``X_JOB_NOT_FOUND``.
            JobNotPromotableError: ``X_JOB_NOT_PROMOTABLE`` otherwise.
        """
        ...

    async def requeue_many(self, flt: JobFilter) -> BulkResult:
        """Requeue up to ``BULK_LIMIT`` (1,000) finished rows matching ``flt``.

        Rows whose key a live row holds stay. Call until ``remaining`` is 0.
        """
        ...

    async def remove_many(self, flt: JobFilter) -> BulkResult:
        """Remove up to 1,000 non-running rows matching ``flt``."""
        ...

    async def promote_many(self, flt: JobFilter) -> BulkResult:
        """Promote up to 1,000 waiting rows matching ``flt``."""
        ...


@dataclass(frozen=True, slots=True)
class StepResolution:
    """An operator's answer about a ``once`` step whose outcome is unknown.

    Attributes:
        ran: whether its effect happened.
        output: the output to record when it ran (JSON form).
    """

    ran: bool
    output: JSONValue = None


@dataclass(frozen=True, slots=True)
class LeaseRequest:
    """One fleet-wide concurrency slot request.

    Attributes:
        key: ``job:<name>`` or ``job-key:<name>:<key>``.
        limit: how many holders the key admits.
        holder: who holds it (the run id, so a run never blocks on its own earlier claim's slot).
        ttl_ms: the slot expires this long after the last acquire/renew.
    """

    key: str
    limit: int
    holder: str
    ttl_ms: int


@runtime_checkable
class LeaseStore(Protocol):
    """Fleet-wide concurrency slots with expiry."""

    async def acquire(self, req: LeaseRequest) -> bool:
        """Take (or renew, if ``holder`` already holds one) a slot; ``False`` when all are held.

        Expired slots are free; a holder's own slot is always renewed.
        """
        ...

    async def renew(self, req: LeaseRequest) -> bool:
        """Extend ``holder``'s slot; ``False`` if it no longer holds one."""
        ...

    async def release(self, key: str, holder: str) -> None:
        """Free ``holder``'s slot (no-op if it holds none)."""
        ...

    async def holders(self, key: str) -> list[str]:
        """Answer the live holders of ``key`` in slot order."""
        ...


@dataclass(frozen=True, slots=True)
class RateRequest:
    """One token asked of a fleet-wide rate bucket (see :mod:`jobs_core.rate`).

    Attributes:
        key: the bucket, ``rate:<name>`` or ``rate-key:<name>:<key>``.
        limit: grants allowed per window (1..10,000).
        per_ms: the window in milliseconds (1 ms to a day).
        now_ms: the request's instant in ms since the epoch; ``None`` (what workers send): the
            store's own clock (the database's on pg, the server's ``TIME`` on Redis), so every
            worker's requests are measured on one clock whatever their hosts' clocks say.
    """

    key: str
    limit: int
    per_ms: int
    now_ms: int | None = None


@runtime_checkable
class RateStore(Protocol):
    """Fleet-wide rate buckets (the ``rate`` capability): a sliding-window log per key.

    A grant at ``now`` needs fewer than ``limit`` grants in ``(now - per_ms, now]``; a request
    whose ``now`` is before the bucket's newest grant counts as arriving at that grant. One
    atomic step per call (one statement on pg, one script on Redis), so concurrent workers never
    both take the last token.
    """

    async def take_token(self, req: RateRequest) -> int:
        """Take one token of ``req.key``, or answer how long until the next one is free.

        Returns:
            0 when granted (the grant is recorded); else the milliseconds (``>= 1``) from the
            request's instant until a request would be granted (nothing is recorded).

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty key, a limit
                outside 1..10,000 or a window outside 1 ms..1 day (:func:`check_rate_request`).
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        ...


def check_rate_request(req: RateRequest) -> None:
    """Refuse a token request no bucket may take: every :class:`RateStore` calls this first.

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty key (or one holding
            U+0000), a limit outside 1..10,000, a window outside 1 ms..1 day, or a negative
            ``now_ms``.
    """
    limit, per = req.limit, req.per_ms
    if (
        not isinstance(req.key, str)
        or not req.key
        or text_problem(req.key) is not None
        or isinstance(limit, bool)
        or not isinstance(limit, int)
        or not 1 <= limit <= MAX_RATE_LIMIT
        or isinstance(per, bool)
        or not isinstance(per, int)
        or not 1 <= per <= MAX_RATE_PER_MS
        or (req.now_ms is not None and (not isinstance(req.now_ms, int) or req.now_ms < 0))
    ):
        raise DriverRequestInvalidError(
            f"a rate token needs a non-empty key, limit 1..{MAX_RATE_LIMIT:,} and per_ms "
            f"1..{MAX_RATE_PER_MS:,}, got key={req.key!r}, limit={limit!r}, per_ms={per!r}",
            key=repr(req.key),
        )


@dataclass(frozen=True, slots=True)
class EventQuery:
    """What a waiting step looks for.

    Attributes:
        name: the event name.
        since: only events published at or after this instant (the bus's clock).
        match: top-level payload keys that must equal these values.
        correlation_key: if set, only events published with this key.
    """

    name: str
    since: datetime
    match: Mapping[str, JSONValue] | None = None
    correlation_key: str | None = None


@dataclass(frozen=True, slots=True)
class PublishRequest:
    """One event to publish.

    Attributes:
        name: the event name.
        payload: its JSON payload.
        correlation_key: an optional key waits may filter on.
        ttl_ms: how long it stays matchable.
    """

    name: str
    payload: JSONValue
    correlation_key: str | None
    ttl_ms: int


@runtime_checkable
class EventBus(Protocol):
    """A stored event bus; ``wakes_waiters`` says whether a publish makes waiting runs due.

    One clock: :meth:`now` stamps publishes and waits alike.
    """

    wakes_waiters: bool

    async def publish(self, req: PublishRequest) -> StoredEvent:
        """Store an event (and, when ``wakes_waiters``, make every matching waiting run due)."""
        ...

    async def find(self, query: EventQuery) -> StoredEvent | None:
        """Answer the earliest unexpired event matching ``query``, or ``None``."""
        ...

    async def now(self) -> datetime:
        """Answer the bus's own current instant (UTC)."""
        ...

    async def purge_expired(self) -> int:
        """Delete expired events; answer how many."""
        ...


@runtime_checkable
class ResettableEventBus(Protocol):
    """An :class:`EventBus` that can forget every event: the test seam behind ``reset_event_bus``.

    A separate protocol rather than a member of :class:`EventBus`, so a third-party bus without it
    still is one; ``reset_event_bus`` then raises ``X_NOT_IMPLEMENTED``.
    """

    async def reset(self) -> int:
        """Delete every event, expired or not (waiting steps are untouched); answer how many."""
        ...


@runtime_checkable
class WakeSource(Protocol):
    """Pushes queue names to idle workers so pickup does not wait for the poll."""

    async def subscribe(self, callback: Callable[[str], None]) -> Callable[[], Awaitable[None]]:
        """Call ``callback(queue)`` (on the subscriber's event loop) whenever work may be due.

        Answers an async unsubscribe function.
        """
        ...


@runtime_checkable
class TimedWakeSource(WakeSource, Protocol):
    """A wake source that also knows when the next row falls due.

    An idle worker sleeps until then instead of polling. Its subscribers are also told a queue's
    name when a row enqueued for later becomes that queue's earliest waiting row (an idle worker
    then asks :meth:`next_due_ms` again).
    """

    async def next_due_ms(self, queues: Sequence[str]) -> int | None:
        """Answer the milliseconds until a row of ``queues`` falls due, or ``None`` for none.

        Measured on the backend's clock; ``0`` when one already is. Paused queues are left out.
        A source may count running rows' lease expiries; one that does not leaves lapsed leases
        to the worker's poll.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        ...


@runtime_checkable
class OutboxStore(Protocol):
    """A transactional outbox: enqueues staged on the caller's transaction, published by a relay.

    ``tx`` is the store's transaction handle (the pg store takes a psycopg connection inside a
    transaction; the memory store its own :class:`~jobs_core.outbox.MemoryTransaction`).

    Optional members, used when present: ``stage_many(reqs, tx)`` (see :class:`OutboxStageMany`;
    absent, the facade stages one by one) and ``relay_lease`` (a :class:`LeaderLease` that one
    relay at a time holds, so a second one takes over only when it lapses; absent, relays claim
    side by side and only the claim rule keeps each lane in order).
    """

    def ambient(self) -> Any | None:
        """Answer the ambient transaction (``jobs_pg.transaction(conn)``), or ``None``."""
        ...

    async def stage(self, req: EnqueueRequest, tx: Any) -> None:
        """Write ``req`` into the outbox on ``tx``; it commits and rolls back with ``tx``."""
        ...

    async def claim(self, req: OutboxClaim) -> list[OutboxRow]:
        """Take up to ``req.limit`` committed, unpublished rows, in ``(staged_at, id)`` order.

        A row is taken only when its claim is free or lapsed AND no unpublished row of its lane
        (``request.order_key``; rows without one share a lane) staged before it is still held
        by an unexpired claim (another relay's, or an earlier one of this relay): a relay
        restarted after a crash never publishes a later row before the rows its predecessor
        still held. Each taken row carries this claim's token.
        """
        ...

    async def release(self, ids: Sequence[UUID], token: str) -> None:
        """Give claimed rows back at once (the relay stopped at an earlier failure)."""
        ...

    async def mark_published(self, ids: Sequence[UUID], token: str) -> int:
        """Mark rows published, fenced on ``token``; answer how many were still this claim's."""
        ...


@runtime_checkable
class OutboxStageMany(Protocol):
    """The optional batch form of :meth:`OutboxStore.stage`."""

    async def stage_many(self, reqs: Sequence[EnqueueRequest], tx: Any) -> None:
        """Stage many requests on ``tx`` (all or none) in one round trip per 1,000."""
        ...


@runtime_checkable
class SchedulerState(Protocol):
    """Cron watermarks and task fires; a fire's jobs and its watermark land in one write.

    A task's watermark is the instant up to which its occurrences are settled: fired, or passed
    over on purpose (catch-up, a first start). It never moves backwards.
    """

    async def watermarks(self) -> dict[str, datetime]:
        """Answer every task's watermark (UTC), by task name."""
        ...

    async def fire(self, fire: TaskFire) -> list[EnqueueResult] | None:
        """Enqueue a fire's jobs and move its task's watermark, atomically.

        The write lands only if the stored watermark equals ``fire.expected`` (``None``: the
        task has none). The jobs are enqueued with :meth:`JobDriver.enqueue`'s semantics (dedupe
        on live keys and explicit ids) and the watermark moves to ``fire.watermark`` (default
        ``fire.occurrence``), both or neither. Answers the enqueue results in request order, or
        ``None`` (writing nothing) when another scheduler moved the watermark first.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID``, writing nothing, for a naive
                instant, an occurrence not after ``expected``, a watermark before the occurrence,
                or a request :meth:`JobDriver.enqueue` refuses.
        """
        ...

    async def advance(self, task: str, expected: datetime | None, to: datetime) -> bool:
        """Move a watermark without firing, compare-and-set like :meth:`fire`.

        Answers ``False`` (writing nothing) when the stored watermark is not ``expected``.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive ``to`` or one not
                after ``expected``.
        """
        ...

    async def task_fires(self) -> list[TaskFireRecord]:
        """Answer the last fire of every task that ever fired, sorted by task name."""
        ...

    async def paused_tasks(self) -> list[str]:
        """Answer the paused tasks, sorted."""
        ...

    async def pause_task(self, task: str) -> None:
        """Stop dispatching ``task``."""
        ...

    async def resume_task(self, task: str) -> None:
        """Dispatch ``task`` again (its catch-up policy decides what was missed)."""
        ...


@runtime_checkable
class LeaderLease(Protocol):
    """One leader at a time: a lease row with an expiry, keyed by a unique incarnation id."""

    async def acquire(self, holder: str, ttl_ms: int) -> bool:
        """Take the lease if it is free or lapsed, or renew it if ``holder`` holds it.

        Answers ``True`` when ``holder`` holds it until ``ttl_ms`` after this call, measured on
        the store's own clock (the database's ``now()`` on pg); ``False`` when another holder's
        lease is unexpired.
        """
        ...

    async def release(self, holder: str) -> None:
        """Give the lease up if ``holder`` holds it."""
        ...

    async def holder(self) -> str | None:
        """Answer the current, unexpired holder."""
        ...


@runtime_checkable
class WorkerRegistry(Protocol):
    """Live workers; a row expires one visibility timeout after its last heartbeat."""

    async def beat(self, info: WorkerInfo, ttl_ms: int) -> None:
        """Insert or refresh a worker's row; it expires ``ttl_ms`` after this call."""
        ...

    async def remove(self, worker_id: str) -> None:
        """Delete a worker's row (a clean stop)."""
        ...

    async def list(self) -> list[WorkerInfo]:
        """Answer the unexpired workers, sorted by id."""
        ...


@runtime_checkable
class CounterStore(Protocol):
    """Per-job outcome counters in tiers: 1 min kept 24 h, 5 min kept 7 d, 1 h kept 30 d.

    Settles add to the current 1-minute bucket (on pg in the settle statement itself);
    :meth:`rollup` folds old buckets into the coarser tiers and drops expired ones.
    """

    async def counters(self, name: str, since: datetime) -> list[CounterBucket]:
        """Answer one job's buckets from ``since`` on, oldest first (at most 4,176)."""
        ...

    async def totals(self, since: datetime) -> dict[str, CounterBucket]:
        """Answer per job name the sums of every bucket from ``since`` on."""
        ...

    async def rollup(self) -> int:
        """Fold and expire buckets; answer how many rows changed."""
        ...


@runtime_checkable
class Preflighted(Protocol):
    """A driver that can tell, before the first job, whether its backend can serve at all.

    The checks are the first-run mistakes a retry cannot mend: a schema not migrated, a role
    without the privileges it needs. A worker runs them when it starts (and ``jobsctl`` before
    a worker, scheduler or relay), so it refuses to start instead of failing every claim.
    """

    async def preflight(self) -> None:
        """Raise the ``JobsError`` that every call would meet; answer nothing when all is well.

        Raises:
            JobsError: e.g. ``X_SCHEMA_NOT_MIGRATED`` or ``X_PERMISSION_DENIED``; an outage is
                ``X_DRIVER_UNAVAILABLE``.
        """
        ...


async def preflight(driver: JobDriver) -> None:
    """Run ``driver``'s first-run checks, when it has them (:class:`Preflighted`).

    An outage (``X_DRIVER_UNAVAILABLE``) passes: a worker started before its database answers
    retries its claims until it does. Every other failure is raised.

    Raises:
        JobsError: what :meth:`Preflighted.preflight` raised, but ``X_DRIVER_UNAVAILABLE``.
    """
    if not isinstance(driver, Preflighted):
        return
    try:
        await driver.preflight()
    except DriverUnavailableError:
        return


@runtime_checkable
class Migratable(Protocol):
    """A driver whose backend needs its schema applied before first use (pg).

    Production applies it as a deploy step (``jobsctl pg migrate``); tools that set up a backend
    themselves (the demo) call :meth:`migrate` when the driver has it.
    """

    async def migrate(self) -> list[str]:
        """Apply what the backend lacks (safe to call concurrently); answer what was applied."""
        ...


async def demand_when_busy(driver: JobDriver, stats: Sequence[QueueStats]) -> dict[str, int]:
    """Answer ``driver.demand()``, asked only when ``stats`` (just read) show work.

    Demand counts running rows and due, claimable ones; with no ``ready``, ``running`` or
    ``suspended`` row in any queue it is 0 everywhere, and the driver is not asked (its demand
    query is the costlier of the two, and idle fleets refresh their gauges all day).

    Args:
        driver: the driver ``stats`` came from.
        stats: its ``stats()`` answer.

    Returns:
        Demand per queue; ``{}`` (0 for every queue) when nothing is waiting or running.
    """
    if not any(queue.ready or queue.running or queue.suspended for queue in stats):
        return {}
    return await driver.demand()


@runtime_checkable
class BackfillLedger(Protocol):
    """The backfill ledger (the ``backfills`` capability): one row per pass of a backfill.

    A pass's id is the id of the job running it, so every attempt of that job (a replay after a
    crash, an operator's requeue) finds its own row. A ``completed`` row is final; a completed
    pass of ``(name, scope)`` is what makes a re-enqueue of the backfill a no-op pass.
    """

    async def begin(self, start: BackfillStart) -> BackfillPass:
        """Open a ``running`` pass, or answer the row that already has ``start.id`` unchanged.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty name or
                checksum.
        """
        ...

    async def record(self, progress: BackfillProgress) -> bool:
        """Store a pass's rows and cursor; a ``failed`` pass becomes ``running`` again.

        Answers ``False``, changing nothing, for an unknown id or a ``completed`` pass.
        """
        ...

    async def settle(self, pass_id: UUID, status: BackfillStatus) -> bool:
        """End a pass ``completed`` (stamping ``completed_at``) or mark it ``failed``.

        Answers ``False``, changing nothing, for an unknown id or a ``completed`` pass.
        """
        ...

    async def completed(self, name: str, scope: str) -> BackfillPass | None:
        """Answer the newest ``completed`` pass of ``(name, scope)``, or ``None``."""
        ...

    async def passes(self, query: BackfillQuery) -> list[BackfillPass]:
        """Answer passes matching ``query``, newest ``started_at`` first.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a limit outside
                1..1,000.
        """
        ...


@runtime_checkable
class ChildJobs(Protocol):
    """Child jobs (the ``children`` capability): rows a run's ``step.invoke``/``gather`` enqueued.

    They are found by the parent's run id the driver stored with them
    (:attr:`~jobs_core.types.EnqueueRequest.parent_run_id`). A driver declaring it also hands
    ``parent_run_id`` back on :class:`~jobs_core.types.ClaimedJob` (the worker publishes the
    child's settle from it) and on :class:`~jobs_core.types.JobInfo`.
    """

    async def children(self, run_id: UUID, ids: Sequence[UUID] | None = None) -> list[JobInfo]:
        """Answer the rows whose parent run is ``run_id``, oldest ``created_at`` first.

        Rows enqueued in one batch share ``created_at``; their order is the driver's.

        Args:
            run_id: the parent's run id.
            ids: only these job ids (``None``: every child of the run).

        Returns:
            The rows without step traces (``steps`` empty); empty when the run has none.
        """
        ...


@runtime_checkable
class RetentionStore(Protocol):
    """Deleting settled rows (the ``retention`` capability): what a retention sweep calls.

    One method, so a driver that keeps settled rows elsewhere (another table, an archive)
    reimplements just this.
    """

    async def purge_settled(self, req: RetentionRequest) -> int:
        """Delete up to ``req.limit`` rows in ``req.states`` settled before ``req.before``.

        A deleted row's steps go with it, in the same write. Live rows are never touched.

        Returns:
            How many rows were deleted (fewer than ``req.limit`` means none is left).

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a live or empty
                ``states``, a naive ``before`` or a limit outside 1..10,000.
        """
        ...


def check_backfill_start(start: BackfillStart) -> None:
    """Refuse a pass no ledger may open: every ledger calls this first.

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty name or checksum,
            or text holding U+0000 (which no driver stores).
    """
    texts = (start.name, start.scope, start.checksum, start.app_version or "")
    if not start.name or not start.checksum or any("\x00" in text for text in texts):
        raise DriverRequestInvalidError(
            "a backfill pass needs a non-empty name and checksum, without U+0000", name=start.name
        )


def check_backfill_query(query: BackfillQuery) -> None:
    """Refuse a ledger query with a limit outside 1..1,000.

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID``.
    """
    limit = query.limit
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1_000:
        raise DriverRequestInvalidError(f"a ledger query answers 1..1,000 passes, not {limit!r}")


def check_retention_request(req: RetentionRequest) -> None:
    """Refuse a retention request no driver may run: every driver calls this first.

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty ``states`` or one
            naming a live state, a naive ``before`` or a ``limit`` outside 1..10,000.
    """
    live = sorted(str(s) for s in req.states if s in LIVE_STATES)
    if not req.states or live:
        raise DriverRequestInvalidError(
            "a retention purge deletes finished rows only (done, failed, dead, cancelled)"
            + (f", not {', '.join(live)}" if live else ""),
            states=sorted(str(s) for s in req.states),
        )
    if not isinstance(req.before, datetime) or req.before.tzinfo is None:
        raise DriverRequestInvalidError("a retention purge needs an aware before= instant")
    limit = req.limit
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
        raise DriverRequestInvalidError(
            f"a retention purge deletes 1..10,000 rows per call, not {limit!r}"
        )


def capability(driver: JobDriver, name: str) -> Any | None:
    """Answer the store a driver carries for capability ``name``, or ``None`` if undeclared.

    Args:
        driver: any :class:`JobDriver`.
        name: one of :data:`CAPABILITIES`.
    """
    if name not in driver.capabilities:
        return None
    if name in FLAG_CAPABILITIES:
        return True
    return getattr(driver, name, None)


def require_capability(driver: JobDriver, name: str) -> Any:
    """Answer the store for capability ``name``.

    Raises:
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` when the driver does not declare it.
    """
    store = capability(driver, name)
    if store is None:
        raise NotImplementedByDriverError(
            f"the {driver.name} driver does not carry the {name!r} capability",
            driver=driver.name,
            capability=name,
        )
    return store


_PG_HINT = "pip install 'jobs-core[pg]' (from a source checkout: pip install -e packages/jobs-pg)"
_REDIS_HINT = (
    "pip install 'jobs-core[redis]' (from a source checkout: pip install -e packages/jobs-redis)"
)
_INSTALL_HINTS = {
    "postgresql": _PG_HINT,
    "postgres": _PG_HINT,
    "redis": _REDIS_HINT,
    "rediss": _REDIS_HINT,
    "redis+cluster": _REDIS_HINT,
    "rediss+cluster": _REDIS_HINT,
}


def redact_url(url: str) -> str:
    """Answer ``url`` with its password masked as ``***`` (in the user part and the query).

    Errors and logs show a driver URL this way, so a copied message never carries a secret.
    """
    parts = urlsplit(url)
    credentials, at, where = parts.netloc.rpartition("@")
    query = parse_qsl(parts.query, keep_blank_values=True)
    if not (at and ":" in credentials) and all(k != "password" for k, _ in query):
        return url
    netloc = parts.netloc
    if at and ":" in credentials:
        netloc = f"{credentials.split(':', 1)[0]}:***@{where}"
    masked = [(k, "***" if k == "password" else v) for k, v in query]
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(masked, safe="*")))


def open_driver(url: str, **options: Any) -> JobDriver:
    """Open a driver for ``url`` through the ``jobs.drivers`` entry point named by its scheme.

    Args:
        url: e.g. ``"memory://"``, ``"postgresql://127.0.0.1/app"``, ``"redis://127.0.0.1:6379/0"``.
        **options: passed to the driver's factory.

    Raises:
        DriverUnknownError: ``X_DRIVER_UNKNOWN`` when no installed distribution registers the
            scheme; the message names the package to install.
    """
    scheme = urlsplit(url).scheme
    if not scheme:
        raise DriverUnknownError(
            f"{url!r} has no scheme; write e.g. memory:// or postgresql://host/db", url=url
        )
    for ep in entry_points(group="jobs.drivers"):
        if ep.name == scheme:
            factory: Callable[..., JobDriver] = ep.load()
            return factory(url, **options)
    installed = sorted({ep.name for ep in entry_points(group="jobs.drivers")})
    hint = _INSTALL_HINTS.get(
        scheme, f"no known package provides it; the drivers installed are {', '.join(installed)}"
    )
    raise DriverUnknownError(
        f"no driver for '{scheme}://': {hint}", scheme=scheme, installed=installed
    )
