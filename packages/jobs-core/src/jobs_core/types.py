"""Record types shared by the runtime and every driver.

These are the nouns of the driver protocol (:mod:`jobs_core.driver`): what an enqueue asks for,
what a claim hands out, how a settle is fenced, what a step record holds. They are frozen
dataclasses so that adding a field with a default never breaks a third-party driver.

Times are aware UTC :class:`~datetime.datetime`; durations are ``int`` milliseconds (suffix
``_ms``); JSON values are what :func:`json.dumps` accepts without a ``default``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, TypeAlias
from uuid import UUID

JSONValue: TypeAlias = Any
"""A value made only of ``dict[str, …]``, ``list``, ``str``, ``int``, ``float``, ``bool`` and
``None`` (the JSON form). ``Any`` because recursive aliases do not narrow usefully."""


class JobState(StrEnum):
    """The states a job row can be in.

    LIVE rows (``ready``, ``delayed``, ``running``, ``suspended``) hold their idempotency key;
    finished rows (``done``, ``failed``, ``dead``, ``cancelled``) do not.
    """

    READY = "ready"
    DELAYED = "delayed"
    RUNNING = "running"
    SUSPENDED = "suspended"
    DONE = "done"
    FAILED = "failed"
    DEAD = "dead"
    CANCELLED = "cancelled"


LIVE_STATES: frozenset[JobState] = frozenset(
    {JobState.READY, JobState.DELAYED, JobState.RUNNING, JobState.SUSPENDED}
)
"""States that hold a live idempotency key and can still run."""

REQUEUEABLE_STATES: frozenset[JobState] = frozenset(
    {JobState.DEAD, JobState.CANCELLED, JobState.DONE, JobState.FAILED}
)
"""Finished states an operator may requeue."""

LEASE_LAPSED_FINAL_ATTEMPT = "LEASE_LAPSED_FINAL_ATTEMPT"
"""The fixed ``last_error`` of a row buried because its lease lapsed on its final attempt."""

OnConflict = Literal["dedupe", "error"]


@dataclass(frozen=True, slots=True)
class EnqueueRequest:
    """One job to queue, in the form every driver accepts.

    Attributes:
        name: the job's durable name.
        queue: the queue it runs on.
        input: the input's JSON form.
        idempotency_key: non-empty; one LIVE row per ``(name, tenant_id or '', key)``.
        tenant_id: the org the row belongs to, or ``None`` for ``tenant="none"`` jobs.
        max_attempts: attempts the row may use (the job's ``retry.attempts`` plus
            ``UNWIND_MARGIN`` for compensating jobs).
        id: an explicit job id; if a row with it exists (live or finished) nothing is inserted and
            that row is answered.
        run_id: an explicit run id (a new one is minted otherwise).
        run_at: the earliest instant the row may run (UTC); ``None`` with ``delay_ms`` 0 is now.
        delay_ms: run no earlier than the driver's now plus this many milliseconds (``>= 0``);
            used when ``run_at`` is ``None`` so the backend's own clock decides.
        traceparent: the W3C trace context of the enqueuing span, if any.
        enqueued_by: the actor id that asked for the work (attribution only).
        order_key: for a staged (outbox) enqueue, the lane whose rows are published in staging
            order even by several relays in parallel (``None``: the one lane of every row
            without a key). Drivers ignore it.
        priority: the claim order within a queue, lower first (``PRIORITY_MIN`` ..
            ``PRIORITY_MAX``, default 0); rows of one priority are taken FIFO by
            ``(run_at, insertion)``. A driver without the ``priority`` capability is never
            sent a non-zero one.
        debounce_ms: when set (``> 0``), a debounced enqueue: a live row holding the key that
            still waits for its first claim (``ready``/``delayed``, never claimed) takes this
            request's input and runs no earlier than the driver's now plus ``debounce_ms``
            (never later than ``debounce_max_ms`` after that row was first enqueued); such a
            row holds its key only until its first claim, so an enqueue after that inserts a
            new row. ``run_at``/``delay_ms`` are unused. Only for drivers with the
            ``debounce`` capability.
        debounce_max_ms: the cap on a debounced row's total wait, from its first enqueue
            (``None``: no cap).
        parent_run_id: the run whose ``step.invoke``/``step.gather`` enqueued this row (a child
            job); drivers with the ``children`` capability store it and list the row under it.
    """

    name: str
    queue: str
    input: JSONValue
    idempotency_key: str
    tenant_id: str | None
    max_attempts: int
    id: UUID
    run_id: UUID
    run_at: datetime | None = None
    delay_ms: int = 0
    traceparent: str | None = None
    enqueued_by: str | None = None
    order_key: str | None = None
    priority: int = 0
    debounce_ms: int | None = None
    debounce_max_ms: int | None = None
    parent_run_id: UUID | None = None


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    """What an enqueue answers.

    Attributes:
        id: the job id (known before commit on every path).
        run_id: the run id, stable across attempts and suspensions.
        deduped: ``True`` when an existing row was answered instead of inserting one.
    """

    id: UUID
    run_id: UUID
    deduped: bool


@dataclass(frozen=True, slots=True)
class BuriedJob:
    """A row the claim buried because its lease lapsed on its final attempt.

    Attributes:
        id: the job id.
        name: the job name.
        queue: its queue.
        state: ``dead`` (dead-lettered) or ``failed`` (its name was in ``drop_exhausted``).
        parent_run_id: the run that enqueued it as a child job (its parent is woken).
    """

    id: UUID
    name: str
    queue: str
    state: JobState
    parent_run_id: UUID | None = None


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """Parameters of one claim.

    Attributes:
        queues: the queues to claim from; an empty sequence is refused
            (``X_DRIVER_REQUEST_INVALID``).
        limit: the most rows to hand out (``>= 1``).
        visibility_timeout_ms: the lease each claimed row gets.
        worker_id: the claimant's unique incarnation id (fences later settles).
        drop_exhausted: job names whose rows, buried for a lapsed final attempt, settle ``failed``
            instead of ``dead`` (their ``Retry(dead_letter=False)``).
        on_exhausted: told about every row this claim buried.
    """

    queues: Sequence[str]
    limit: int
    visibility_timeout_ms: int
    worker_id: str
    drop_exhausted: frozenset[str] = frozenset()
    on_exhausted: Callable[[BuriedJob], None] | None = None


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A row handed to one claimant under a lease.

    Attributes:
        id: the job id.
        run_id: the run id.
        name: the job name.
        queue: the queue.
        input: the stored JSON form of the input.
        attempt: this attempt's number (1-based; suspensions and interrupted attempts do not
            advance it, a lapsed lease does).
        max_attempts: the row's attempt budget.
        claim: the row's claim ordinal after this claim; settles are fenced on it.
        worker_id: the claimant.
        tenant_id: the row's tenant.
        idempotency_key: the row's key.
        traceparent: the enqueuing span's trace context.
        enqueued_by: the actor that asked for the work.
        created_at: when the row was first queued (UTC).
        parent_run_id: the run that enqueued this row as a child job (its settle wakes it).
    """

    id: UUID
    run_id: UUID
    name: str
    queue: str
    input: JSONValue
    attempt: int
    max_attempts: int
    claim: int
    worker_id: str
    tenant_id: str | None
    idempotency_key: str
    traceparent: str | None
    enqueued_by: str | None
    created_at: datetime
    parent_run_id: UUID | None = None

    @property
    def fence(self) -> Fence:
        """The claim identity every settle and step write of this attempt is fenced on."""
        return Fence(self.worker_id, self.claim)


@dataclass(frozen=True, slots=True)
class Fence:
    """A claim identity: a settle lands only while the row is ``running`` under it.

    Attributes:
        worker_id: the claimant's incarnation id.
        claim: the claim ordinal it was handed.
    """

    worker_id: str
    claim: int


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """A failure as stored on a row: a summary, never the live exception.

    Attributes:
        message: ``str(error)``, truncated to 2,000 characters.
        code: the ``X_…`` code if the error carried one.
        stack: the formatted traceback, truncated to 8,000 characters.
    """

    message: str
    code: str | None = None
    stack: str | None = None


@dataclass(frozen=True, slots=True)
class Settle:
    """Parameters of an ack (the row ends ``done``).

    Attributes:
        fence: the claim identity the ack is fenced on.
        result: the body's return value in JSON form (kept for ``introspect.get``).
        duration_ms: how long the attempt ran, for counters.
    """

    fence: Fence
    result: JSONValue = None
    duration_ms: float | None = None


@dataclass(frozen=True, slots=True)
class NackOptions:
    """Parameters of a nack; the target state is :func:`nack_state` of these.

    Attributes:
        fence: the claim identity the nack is fenced on.
        error: why, as stored on the row (``None`` for a park or a hand-back).
        delay_ms: when ``ready``/``delayed``/``suspended``: run again no sooner than this.
        dead_letter: settle ``dead`` now.
        fail: settle ``failed`` now (``dead_letter`` wins if both are set).
        park: settle ``suspended`` (a sleep or a wait); never counts an attempt.
        count_attempt: whether this attempt is spent (``False`` for suspensions, drain
            interruptions and in-process limit hand-backs).
    """

    fence: Fence
    error: ErrorInfo | None = None
    delay_ms: int = 0
    dead_letter: bool = False
    fail: bool = False
    park: bool = False
    count_attempt: bool = True


def nack_state(opts: NackOptions) -> JobState:
    """Answer the state a nack settles a row in; every driver uses this one function.

    Precedence: ``dead`` (``dead_letter``) > ``failed`` (``fail``) > ``suspended`` (``park``) >
    ``delayed`` (``delay_ms > 0``) > ``ready``.
    """
    if opts.dead_letter:
        return JobState.DEAD
    if opts.fail:
        return JobState.FAILED
    if opts.park:
        return JobState.SUSPENDED
    if opts.delay_ms > 0:
        return JobState.DELAYED
    return JobState.READY


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Counts for one queue, by effective state at the driver's now.

    ``ready`` counts rows in ``ready``/``delayed`` whose ``run_at`` has passed; ``delayed`` those
    still in the future; ``oldest_ready_ms`` is how long the oldest due row has waited (0 if none).
    """

    queue: str
    ready: int = 0
    delayed: int = 0
    running: int = 0
    suspended: int = 0
    done: int = 0
    failed: int = 0
    dead: int = 0
    cancelled: int = 0
    oldest_ready_ms: int = 0


StepStatus = Literal["started", "completed", "waiting", "failed"]


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One persisted step of a run.

    Attributes:
        name: the step name (the replay key).
        status: ``started`` (a ``once`` step before its function returned), ``completed``,
            ``waiting`` (a sleep or event wait), ``failed`` (its function raised; it runs again).
        output: the JSON form of the function's result (``completed`` only).
        seq: the order the step was first written in within the run (0-based).
        started_at: when it was first written.
        completed_at: when it completed.
        wake_at: a waiting step's deadline (sleep end or wait timeout).
        event: a waiting step's event name.
        match: a waiting step's payload filter (top-level key equality).
        attempts: how many times the function ran and raised.
        error: the last failure's summary.
        once: whether it is an at-most-once step.
    """

    name: str
    status: StepStatus
    output: JSONValue = None
    seq: int = 0
    started_at: datetime | None = None
    completed_at: datetime | None = None
    wake_at: datetime | None = None
    event: str | None = None
    match: Mapping[str, JSONValue] | None = None
    attempts: int = 0
    error: str | None = None
    once: bool = False


@dataclass(frozen=True, slots=True)
class StepWrite:
    """One fenced step write.

    Attributes:
        job_id: the row whose claim fences the write (``None`` for ``run_inline``).
        fence: the claim identity (``None`` for ``run_inline``).
        run_id: the run the step belongs to.
        record: the record to store (replaces any record of the same name).
    """

    job_id: UUID | None
    fence: Fence | None
    run_id: UUID
    record: StepRecord


@dataclass(frozen=True, slots=True)
class JobInfo:
    """One job as the operator surface shows it (``introspect.get``/``list``).

    ``input`` is the stored JSON form; redaction is applied by :mod:`jobs_core.introspect`.
    ``parent_run_id`` is the run that enqueued the row as a child job (``None`` otherwise).
    """

    id: UUID
    run_id: UUID
    name: str
    queue: str
    state: JobState
    attempt: int
    max_attempts: int
    claim: int
    tenant_id: str | None
    idempotency_key: str
    input: JSONValue
    run_at: datetime
    created_at: datetime
    updated_at: datetime
    claimed_by: str | None = None
    last_error: str | None = None
    last_error_code: str | None = None
    last_error_stack: str | None = None
    result: JSONValue = None
    progress: JSONValue = None
    enqueued_by: str | None = None
    traceparent: str | None = None
    steps: tuple[StepRecord, ...] = ()
    priority: int = 0
    parent_run_id: UUID | None = None


@dataclass(frozen=True, slots=True)
class JobFilter:
    """A listing filter; every field is optional and they combine with AND.

    Attributes:
        queue: only this queue.
        name: only this job name.
        state: only this state.
        tenant_id: only this tenant.
        id_prefix: only ids whose text starts with this.
        created_from: created at or after (UTC).
        created_to: created before (UTC).
        limit: page size (default 100, at most ``MAX_JOB_PAGE`` = 200).
        after: a cursor from a previous page: older rows than it.
        before: a cursor from a previous page: newer rows than it.
    """

    queue: str | None = None
    name: str | None = None
    state: JobState | None = None
    tenant_id: str | None = None
    id_prefix: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    limit: int = 100
    after: str | None = None
    before: str | None = None


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of a listing, newest first.

    Attributes:
        rows: the jobs on this page (without step traces).
        next: cursor for the page of older rows (pass as ``after``), or ``None`` at the end.
        prev: cursor for the page of newer rows (pass as ``before``), or ``None`` at the start.
    """

    rows: tuple[JobInfo, ...]
    next: str | None
    prev: str | None


BackfillStatus = Literal["running", "completed", "failed"]
"""Where a backfill pass stands: ``running`` (begun, not finished), ``completed`` (every page
handled; final) or ``failed`` (the pass's job dead-lettered or was dropped; a requeue of that job
resumes it and sets it ``running`` again)."""


@dataclass(frozen=True, slots=True)
class BackfillPass:
    """One row of the backfill ledger: one pass of one backfill over one scope.

    Attributes:
        id: the pass's id (the id of the job that runs it).
        name: the backfill's name.
        scope: the scope (``""`` for a backfill without ``scope``).
        checksum: a digest of the declaration the pass ran under (name, source, batch, handler).
        status: ``running``, ``completed`` or ``failed``.
        app_version: the app's build when the pass began (``JOBS_BUILD``), if known.
        rows: rows handled so far.
        last_cursor: the cursor after the last handled page (JSON; ``None`` at the end).
        started_at: when the pass began (UTC, the ledger's clock).
        completed_at: when it completed, if it did.
    """

    id: UUID
    name: str
    scope: str
    checksum: str
    status: BackfillStatus
    app_version: str | None
    rows: int
    last_cursor: JSONValue
    started_at: datetime
    completed_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class BackfillStart:
    """A pass to open in the ledger (``BackfillLedger.begin``).

    Attributes:
        id: the pass's id; beginning an id the ledger holds answers that row unchanged.
        name: the backfill's name.
        scope: the scope (``""`` for none).
        checksum: the declaration's digest.
        app_version: the app's build, if known.
    """

    id: UUID
    name: str
    scope: str
    checksum: str
    app_version: str | None = None


@dataclass(frozen=True, slots=True)
class BackfillProgress:
    """Where a running pass got to (``BackfillLedger.record``).

    Attributes:
        id: the pass's id.
        rows: rows handled so far (the whole pass's count, not this page's).
        cursor: the cursor after the last handled page (JSON).
    """

    id: UUID
    rows: int
    cursor: JSONValue


@dataclass(frozen=True, slots=True)
class BackfillQuery:
    """Which passes ``BackfillLedger.passes`` answers.

    Attributes:
        name: only passes of this backfill (``None``: every backfill).
        scope: only this scope (``None``: every scope).
        limit: the most passes answered, newest first (1..1,000).
    """

    name: str | None = None
    scope: str | None = None
    limit: int = 100


@dataclass(frozen=True, slots=True)
class RetentionRequest:
    """Settled rows to delete, with their steps (``RetentionStore.purge_settled``).

    Attributes:
        states: the finished states to delete (a subset of ``done``, ``failed``, ``dead``,
            ``cancelled``; a live state is refused).
        before: only rows settled (last updated) strictly before this instant (UTC).
        limit: the most rows one call deletes (1..10,000), so a sweep over millions of rows is
            many short statements, never one long one.
    """

    states: frozenset[JobState]
    before: datetime
    limit: int = 1_000


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """An event as a bus stores it.

    Attributes:
        id: the event id.
        name: the event name.
        payload: its JSON payload.
        correlation_key: an optional key waits may filter on.
        published_at: the bus's own clock at publish (UTC).
        expires_at: when it stops being matchable.
    """

    id: UUID
    name: str
    payload: JSONValue
    correlation_key: str | None
    published_at: datetime
    expires_at: datetime


MAX_JOB_PAGE = 200
"""The largest page ``introspect.list`` hands out."""

MAX_ENQUEUE_BATCH = 10_000
"""The most inputs one ``enqueue_many`` call accepts."""

ENQUEUE_CHUNK = 1_000
"""Rows per round trip in ``enqueue_many``."""

MAX_JSON_DEPTH = 200
"""The deepest nesting of objects and arrays an input or a step output may have (a value nested
deeper is refused: Python's JSON decoder gives up near 1,000 levels, pydantic's serializer near
255)."""

UNWIND_MARGIN = 2
"""Extra attempts a compensating job's rows carry so that a crash on the final attempt can still
unwind."""


@dataclass(frozen=True, slots=True)
class OutboxClaim:
    """Parameters of a relay's claim on staged outbox rows.

    Attributes:
        relay_id: the claiming relay's incarnation id.
        limit: the most rows to take (``>= 1``).
        lease_ms: how long the claim holds before another relay may take the rows.
    """

    relay_id: str
    limit: int
    lease_ms: int


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """A staged enqueue, as a relay claims it.

    Attributes:
        request: the enqueue to publish; ``request.id`` is the row id and the job id, and
            ``request.order_key`` its lane.
        staged_at: when it was staged (the store's clock); publish order is
            ``(staged_at, request.id)``.
        token: the claim token the relay's ``mark_published``/``release`` are fenced on.
    """

    request: EnqueueRequest
    staged_at: datetime
    token: str


@dataclass(frozen=True, slots=True)
class TaskFire:
    """One occurrence of a cron task, fired with its jobs and its watermark in one write.

    Attributes:
        task: the task name.
        occurrence: the occurrence's instant (UTC).
        expected: the watermark the scheduler read (``None`` for a task never fired); the fire
            lands only if the stored watermark still equals it (compare-and-set).
        requests: the jobs to enqueue (deduped like any enqueue).
        watermark: where the fire leaves the watermark (UTC, at or after ``occurrence``);
            ``None`` means ``occurrence``. ``run-once`` catch-up fires the earliest missed
            occurrence and moves the watermark past the latest missed one in this same write, so
            a crash cannot separate the two and fire the backlog again.
        cron: the task's cron expression as declared, kept with the fire record so an operator
            listing tasks without the app's code sees the schedule (``None``: not told).
        tz: the task's IANA time zone, likewise.
    """

    task: str
    occurrence: datetime
    expected: datetime | None
    requests: tuple[EnqueueRequest, ...]
    watermark: datetime | None = None
    cron: str | None = None
    tz: str | None = None


@dataclass(frozen=True, slots=True)
class TaskFireRecord:
    """The last fire of one task, as ``SchedulerState.task_fires()`` shows it.

    Attributes:
        task: the task name.
        occurrence: the occurrence that fired (UTC).
        watermark: where that fire left the watermark (UTC; later than ``occurrence`` after a
            ``run-once`` catch-up).
        fired_at: when the fire landed, on the store's clock (UTC).
        job_ids: the ids its enqueues answered, in entry order (deduped ones included).
        cron: the cron expression the fire was made under (``None`` when the fire did not say:
            a store written before it kept them, or a fire made by hand).
        tz: the IANA time zone the fire was made under, likewise.
    """

    task: str
    occurrence: datetime
    watermark: datetime
    fired_at: datetime
    job_ids: tuple[UUID, ...]
    cron: str | None = None
    tz: str | None = None


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A live worker as the registry shows it.

    Attributes:
        id: the incarnation id.
        host: the host name.
        build: the app's build or version string.
        started_at: when it started (UTC).
        queues: the queues it serves.
        slots: its capacity.
        in_flight: ids of the rows it holds (at most 100).
        last_heartbeat: its last registry heartbeat (UTC).
        draining_at: when it began draining, if it is.
    """

    id: str
    host: str
    build: str
    started_at: datetime
    queues: tuple[str, ...]
    slots: int
    in_flight: tuple[UUID, ...] = ()
    last_heartbeat: datetime | None = None
    draining_at: datetime | None = None


BULK_LIMIT = 1_000
"""The most rows one bulk operator call touches."""

ON_SETTLED_TIMEOUT_MS = 30_000
"""The ``on_settled`` hook's ceiling across every try, unless the job declares
``on_settled_timeout``."""

PROGRESS_INTERVAL_MS = 1_000
"""``ctx.progress`` writes at most once per this many milliseconds per run, plus the last one
before the settle."""

MAX_WORKER_IN_FLIGHT = 100
"""The most in-flight job ids one worker registry row carries."""

DEFAULT_EVENT_POLL_MS = 30_000
"""How long a waiting step parks between checks on a bus that does not wake waiters."""

WAKING_EVENT_POLL_MS = 15 * 60_000
"""The backstop park of a waiting step on a bus that wakes waiters (and the timeout's clock)."""

CounterTier = Literal["1m", "5m", "1h"]


@dataclass(frozen=True, slots=True)
class CounterTierSpec:
    """One tier of the outcome counters.

    Attributes:
        tier: its name (``1m``, ``5m``, ``1h``).
        width_ms: how long one bucket of it spans.
        kept_ms: how long its buckets are kept before they fold into the next tier (or, for the
            last tier, are dropped).
    """

    tier: CounterTier
    width_ms: int
    kept_ms: int


COUNTER_TIERS: tuple[CounterTierSpec, ...] = (
    CounterTierSpec("1m", 60_000, 24 * 3_600_000),
    CounterTierSpec("5m", 5 * 60_000, 7 * 24 * 3_600_000),
    CounterTierSpec("1h", 3_600_000, 30 * 24 * 3_600_000),
)
"""The counter tiers, finest first: 1-minute buckets for 24 h, 5-minute for 7 d, 1-hour for 30 d.
Buckets are aligned on the Unix epoch; the scheduler leader folds them (``rollup``) once a minute.
"""

MAX_COUNTER_ROWS = sum(spec.kept_ms // spec.width_ms for spec in COUNTER_TIERS)
"""The most counter buckets kept per job name: 24 h of 1-minute buckets (1,440), 7 d of 5-minute
buckets (2,016) and 30 d of 1-hour buckets (720): 4,176."""


@dataclass(frozen=True, slots=True)
class BulkResult:
    """What a bulk operator call did.

    Attributes:
        affected: rows changed by this call (at most ``BULK_LIMIT``).
        remaining: rows still matching afterwards that the operation would change ("call until
            zero" terminates).
    """

    affected: int
    remaining: int


@dataclass(frozen=True, slots=True)
class CounterBucket:
    """Outcome counts of one job name in one time bucket.

    Attributes:
        name: the job name.
        tier: ``1m``, ``5m`` or ``1h``.
        bucket: the bucket's first instant (UTC).
        done: rows settled ``done``.
        retried: attempts retried.
        failed: rows settled ``failed``.
        dead: rows settled ``dead``.
        duration_ms: the sum of completed attempts' durations.
    """

    name: str
    tier: CounterTier
    bucket: datetime
    done: int = 0
    retried: int = 0
    failed: int = 0
    dead: int = 0
    duration_ms: float = 0.0
