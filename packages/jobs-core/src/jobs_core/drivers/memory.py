"""The in-memory driver (``memory://``): every capability in one process, with the same semantics.

It is a real driver, not a mock: it fences settles and step writes on the claim identity, lets
leases lapse, buries rows whose lease lapsed on their final attempt, honours pauses, dedupes live
keys and pages listings with cursors, as a database-backed driver does, and it must pass the
whole conformance suite. ``jobsctl dev``, the demo and unit tests run on it.

Design notes (the alternatives that were rejected):

* **One lock, no awaits.** A single :class:`threading.RLock` guards all state. The methods are
  ``async`` for the protocol's sake but never await: each one does its whole read or write under
  the lock, so a sync job body in a worker thread (driving an event loop of its own) and the
  worker's loop always see one consistent store. An :class:`asyncio.Lock` was rejected because it
  would not serialise callers on other threads' loops.
* **JSON values are stored as JSON text** (inputs, results, progress, step outputs, event payloads)
  and decoded on every read, as a database does. Keeping the caller's objects was rejected: a
  caller mutating its dict after an enqueue would change the stored row, a replay would answer a
  different value than other drivers, and a value Postgres refuses (not JSON, ``NaN``, a NUL
  character) would be accepted here.
* **Claims pop heaps instead of scanning rows.** Each queue has two heaps with lazy deletion:
  ``pending``, keyed by the instant a row becomes claimable (its ``run_at``, or a running row's
  lease expiry), and ``due``, keyed by ``(run_at, seq)`` for rows that already are. Each row
  carries a ``token``; an entry whose token is not the row's current one is stale and is dropped
  when it surfaces, so a settled row costs one pop and never slows later claims. A heartbeat does
  not touch the heaps: an entry that surfaces before the row's current lease expiry is filed again
  at that expiry. A sorted scan over all live rows per claim was rejected: with a million queued
  rows it makes every claim linear.
* **Time comes only from the injected** :class:`~jobs_core.clock.Clock`, so tests can freeze and
  advance it; every "is it due" decision reads ``clock.now()`` once per call.
"""

from __future__ import annotations

import asyncio
import base64
import heapq
import json
import re
import threading
from bisect import bisect_left, bisect_right, insort
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import Any, TypeAlias
from urllib.parse import urlsplit
from uuid import UUID

from jobs_core.clock import SYSTEM_CLOCK, Clock
from jobs_core.driver import (
    CAPABILITIES,
    EventQuery,
    LeaseRequest,
    PublishRequest,
    StepResolution,
    StepStore,
    check_enqueue_request,
    check_run_ids,
    check_task_name,
    check_watermark_forward,
    run_id_taken,
)
from jobs_core.drivers.memory_backfills import MemoryBackfillLedger
from jobs_core.drivers.memory_outbox import MemoryOutboxStore
from jobs_core.drivers.memory_rate import MemoryRateStore
from jobs_core.drivers.memory_retention import MemoryRetentionStore
from jobs_core.errors import (
    DriverRequestInvalidError,
    DriverUnavailableError,
    JobCancelledError,
    JobDuplicateError,
    JobNotCancellableError,
    JobNotFoundError,
    JobNotPromotableError,
    JobNotRemovableError,
    JobNotRequeueableError,
    JobPageInvalidError,
    MaxAttemptsError,
    StepNotResolvableError,
)
from jobs_core.ids import new_id
from jobs_core.serialization import json_text_has_surrogate
from jobs_core.types import (
    BULK_LIMIT,
    COUNTER_TIERS,
    LEASE_LAPSED_FINAL_ATTEMPT,
    LIVE_STATES,
    MAX_COUNTER_ROWS,
    MAX_JOB_PAGE,
    BulkResult,
    BuriedJob,
    ClaimedJob,
    ClaimRequest,
    CounterBucket,
    CounterTier,
    EnqueueRequest,
    EnqueueResult,
    Fence,
    JobFilter,
    JobInfo,
    JobPage,
    JobState,
    JSONValue,
    NackOptions,
    QueueStats,
    Settle,
    StepRecord,
    StepWrite,
    StoredEvent,
    TaskFire,
    TaskFireRecord,
    WorkerInfo,
    nack_state,
)

_CAPABILITIES = frozenset(
    {
        "introspect",
        "leases",
        "events",
        "wake",
        "workers",
        "counters",
        "scheduler_state",
        "leader",
        "outbox",
        "backfills",
        "retention",
        "priority",
        "debounce",
        "children",
        "rate",
    }
)
_CURSOR = re.compile(r"mem1\|(-?\d{1,20})\|([0-9a-f]{32})")
# A JSON ``\u0000`` escape, i.e. one not itself escaped by an odd run of backslashes.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ENCODE = json.JSONEncoder(allow_nan=False).encode
_ONE_MS = timedelta(milliseconds=1)
_ONE_US = timedelta(microseconds=1)
_QUEUED = frozenset({JobState.READY, JobState.DELAYED, JobState.SUSPENDED})
"""States waiting on ``run_at`` (claimable once it has passed)."""
_WAITING = frozenset({JobState.DELAYED, JobState.SUSPENDED})
"""States an operator may promote while their ``run_at`` is still ahead."""
_COUNTED: dict[JobState, str] = {
    JobState.DONE: "done",
    JobState.FAILED: "failed",
    JobState.DEAD: "dead",
}
"""Finished states that add to the job's counters (a cancel is an operator's act, not an
outcome)."""
_TIER_WIDTH: dict[CounterTier, timedelta] = {
    spec.tier: timedelta(milliseconds=spec.width_ms) for spec in COUNTER_TIERS
}
_TIER_KEPT: dict[CounterTier, timedelta] = {
    spec.tier: timedelta(milliseconds=spec.kept_ms) for spec in COUNTER_TIERS
}
_TIER_PARENT: dict[CounterTier, CounterTier | None] = {
    spec.tier: (COUNTER_TIERS[i + 1].tier if i + 1 < len(COUNTER_TIERS) else None)
    for i, spec in enumerate(COUNTER_TIERS)
}


@dataclass(slots=True, eq=False)
class _Row:
    """One job row. JSON fields hold JSON text; ``attempts`` counts spent attempts."""

    id: UUID
    run_id: UUID
    name: str
    queue: str
    input: str
    idempotency_key: str
    tenant_id: str | None
    state: JobState
    max_attempts: int
    run_at: datetime
    created_at: datetime
    updated_at: datetime
    seq: int
    attempts: int = 0
    claim: int = 0
    claimed_by: str | None = None
    visible_at: datetime | None = None
    last_error: str | None = None
    last_error_code: str | None = None
    last_error_stack: str | None = None
    result: str = "null"
    progress: str = "null"
    traceparent: str | None = None
    enqueued_by: str | None = None
    # The run whose step.invoke/gather enqueued this row (a child job).
    parent_run_id: UUID | None = None
    # An event its waiting step matches was published while the row ran: its park is due at once.
    wake_pending: bool = False
    # Only the heap entry carrying the current token is valid (see the module docstring).
    token: int = 0
    # Lower is claimed first within a queue (jobs_core.priority).
    priority: int = 0
    # Enqueued with debounce: the row holds its live key only until its first claim.
    debounced: bool = False


# (instant, seq, token, row): ``seq`` is unique per row and one row's entries carry distinct
# tokens, so tuple comparison never reaches the row itself.
_Entry: TypeAlias = tuple[datetime, int, int, _Row]
# A claimable row: (priority, run_at, seq, token, row), so a claim takes the lowest priority
# first and, within one priority, the oldest (run_at, insertion).
_DueEntry: TypeAlias = tuple[int, datetime, int, int, _Row]


@dataclass(slots=True, eq=False)
class _Queue:
    """Claim heaps and finished-row counts of one queue."""

    pending: list[_Entry] = field(default_factory=list)
    due: list[_DueEntry] = field(default_factory=list)
    finished: dict[JobState, int] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class _Counts:
    """Outcome counts of one counter bucket."""

    done: int = 0
    retried: int = 0
    failed: int = 0
    dead: int = 0
    duration_ms: float = 0.0

    def add(self, other: _Counts) -> None:
        self.done += other.done
        self.retried += other.retried
        self.failed += other.failed
        self.dead += other.dead
        self.duration_ms += other.duration_ms

    def bucket(self, name: str, tier: CounterTier, start: datetime) -> CounterBucket:
        return CounterBucket(
            name=name,
            tier=tier,
            bucket=start,
            done=self.done,
            retried=self.retried,
            failed=self.failed,
            dead=self.dead,
            duration_ms=self.duration_ms,
        )


_CounterKey: TypeAlias = tuple[CounterTier, datetime]


def _floor(instant: datetime, width: timedelta) -> datetime:
    """Answer the start of the ``width``-long bucket holding ``instant`` (aligned on the epoch)."""
    return _EPOCH + ((instant - _EPOCH) // width) * width


@dataclass(slots=True, eq=False)
class _Step:
    """One stored step: the record without its JSON fields, which are kept as text."""

    record: StepRecord
    output: str
    match: str | None
    # A private decoded copy of ``match``, read when a publish looks for waiting runs.
    match_value: dict[str, Any] | None


@dataclass(slots=True, eq=False)
class _Event:
    """One stored event; ``payload_value`` is a private decoded copy used for matching."""

    id: UUID
    name: str
    payload: str
    payload_value: Any
    correlation_key: str | None
    published_at: datetime
    expires_at: datetime
    seq: int

    def stored(self) -> StoredEvent:
        return StoredEvent(
            id=self.id,
            name=self.name,
            payload=json.loads(self.payload),
            correlation_key=self.correlation_key,
            published_at=self.published_at,
            expires_at=self.expires_at,
        )


@dataclass(slots=True, eq=False)
class _Slot:
    """One held lease slot."""

    holder: str
    expires_at: datetime


_Subscriber: TypeAlias = tuple[asyncio.AbstractEventLoop, Callable[[str], None]]


def _encode(value: JSONValue, what: str) -> str:
    """Answer ``value`` as JSON text, refusing what Postgres would refuse too.

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` when ``value`` is not JSON (an
            arbitrary object, a cycle, ``NaN`` or an infinity) or holds a NUL character or a lone
            surrogate.
    """
    # null, true, false and ints (a no-op's result, a flag, a count) skip building an encoder.
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    try:
        # An int is its repr, as json writes it (a too-long one raises ValueError in both).
        text = int.__repr__(value) if type(value) is int else _ENCODE(value)
    except (TypeError, ValueError) as exc:
        raise DriverRequestInvalidError(f"{what} is not a JSON value: {exc}", field=what) from exc
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise DriverRequestInvalidError(
            f"{what} holds a NUL character (U+0000), which no driver can store", field=what
        )
    if json_text_has_surrogate(text):
        raise DriverRequestInvalidError(
            f"{what} holds a lone surrogate (U+D800..U+DFFF), which UTF-8 cannot encode",
            field=what,
        )
    return text


def _bare(record: StepRecord, seq: int) -> StepRecord:
    """Answer ``record`` at ``seq`` without its JSON fields (kept as text beside it).

    Built field by field: ``dataclasses.replace`` costs twice as much on every step write.
    """
    return StepRecord(
        name=record.name,
        status=record.status,
        output=None,
        seq=seq,
        started_at=record.started_at,
        completed_at=record.completed_at,
        wake_at=record.wake_at,
        event=record.event,
        match=None,
        attempts=record.attempts,
        error=record.error,
        once=record.once,
    )


def _utc(instant: datetime, what: str) -> datetime:
    """Answer an aware instant in UTC; a naive one is refused (``X_DRIVER_REQUEST_INVALID``)."""
    if instant.utcoffset() is None:
        raise DriverRequestInvalidError(f"{what} must be an aware datetime (UTC)", field=what)
    return instant.astimezone(UTC)


def _plus_ms(instant: datetime, ms: int, what: str) -> datetime:
    """Answer ``instant`` plus ``ms`` milliseconds; out of range is ``X_DRIVER_REQUEST_INVALID``."""
    try:
        return instant + timedelta(milliseconds=ms)
    except OverflowError as exc:
        raise DriverRequestInvalidError(f"{what}={ms} ms is out of range", field=what) from exc


def _live_key(row: _Row) -> tuple[str, str, str]:
    return (row.name, row.tenant_id or "", row.idempotency_key)


def _position(row: _Row) -> tuple[datetime, int]:
    """A row's place in listings: ``(created_at, id)``, newest last."""
    return (row.created_at, row.id.int)


def _cursor(row: _Row) -> str:
    """Encode a row's listing position as an opaque cursor."""
    micros = (row.created_at - _EPOCH) // _ONE_US
    raw = f"mem1|{micros}|{row.id.int:032x}"
    return base64.urlsafe_b64encode(raw.encode("ascii")).decode("ascii").rstrip("=")


def _cursor_position(cursor: str) -> tuple[datetime, int]:
    """Decode a cursor from :func:`_cursor` into a listing position.

    Raises:
        JobPageInvalidError: ``X_JOB_PAGE_INVALID`` for anything this driver did not issue.
    """
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        raw = base64.b64decode(padded, altchars=b"-_", validate=True).decode("ascii")
        found = _CURSOR.fullmatch(raw)
        if found is None:
            raise ValueError("not a memory-driver cursor")
        return (_EPOCH + timedelta(microseconds=int(found[1])), int(found[2], 16))
    except (ValueError, OverflowError) as exc:
        raise JobPageInvalidError(
            "the cursor was not issued by this listing; pass back a page's next or prev",
            driver="memory",
        ) from exc


def _json_equal(left: Any, right: Any) -> bool:
    """Answer whether two decoded JSON values are equal as JSON values.

    Python's ``==`` holds ``True == 1``; JSON (and Postgres ``jsonb``) does not, so booleans only
    equal booleans, at any depth. Numbers compare by value (``1`` equals ``1.0``), as in ``jsonb``.
    """
    if isinstance(left, bool) or isinstance(right, bool):
        return type(left) is type(right) and left == right
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(
            _json_equal(v, right[k]) for k, v in left.items()
        )
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(map(_json_equal, left, right))
    return bool(left == right)


def _payload_matches(match: Mapping[str, Any] | None, payload: Any) -> bool:
    """Answer whether every key of ``match`` is a top-level payload key with an equal value."""
    if not match:
        return True
    if not isinstance(payload, dict):
        return False
    return all(key in payload and _json_equal(payload[key], value) for key, value in match.items())


def _older(rows: list[_Row], stop: int, keep: Callable[[_Row], bool]) -> Iterator[_Row]:
    """Rows of the listing before index ``stop`` that ``keep`` accepts, newest first."""
    return (rows[i] for i in range(stop - 1, -1, -1) if keep(rows[i]))


def _newer(rows: list[_Row], start: int, keep: Callable[[_Row], bool]) -> Iterator[_Row]:
    """Rows of the listing from index ``start`` on that ``keep`` accepts, oldest first."""
    return (rows[i] for i in range(start, len(rows)) if keep(rows[i]))


def _row_filter(flt: JobFilter) -> Callable[[_Row], bool]:
    """Answer a predicate for a listing filter (every given field must hold)."""
    prefix = flt.id_prefix.lower() if flt.id_prefix else None
    created_from = None if flt.created_from is None else _utc(flt.created_from, "created_from")
    created_to = None if flt.created_to is None else _utc(flt.created_to, "created_to")

    def keep(row: _Row) -> bool:
        return (
            (flt.queue is None or row.queue == flt.queue)
            and (flt.name is None or row.name == flt.name)
            and (flt.state is None or row.state == flt.state)
            and (flt.tenant_id is None or row.tenant_id == flt.tenant_id)
            and (prefix is None or str(row.id).startswith(prefix))
            and (created_from is None or row.created_at >= created_from)
            and (created_to is None or row.created_at < created_to)
        )

    return keep


class _Memory:
    """The state of one memory driver, shared by the driver and its stores.

    Every attribute is read and written only while ``lock`` is held.
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.lock = threading.RLock()
        self.closed = False
        self.seq = 0
        self.rows: dict[UUID, _Row] = {}
        self.live: dict[UUID, _Row] = {}
        self.keys: dict[tuple[str, str, str], _Row] = {}
        # Run id -> the row that owns it (every row, live or finished, until it is removed).
        self.runs: dict[UUID, _Row] = {}
        # Parent run id -> its child rows by id, in insertion order.
        self.children: dict[UUID, dict[UUID, _Row]] = {}
        self.queues: dict[str, _Queue] = {}
        self.paused: set[str] = set()
        # Every row ordered by _position, for cursor paging.
        self.listing: list[_Row] = []
        # Finished rows per state, in the order they settled (a retention purge's walk).
        self.settled: dict[JobState, dict[UUID, _Row]] = {}
        self.steps: dict[UUID, dict[str, _Step]] = {}
        self.events: dict[str, list[_Event]] = {}
        self.leases: dict[str, list[_Slot]] = {}
        self.subscribers: dict[int, _Subscriber] = {}
        self.watermarks: dict[str, datetime] = {}
        self.task_fires: dict[str, TaskFireRecord] = {}
        self.paused_tasks: set[str] = set()
        self.leader: _Slot | None = None
        # Worker id -> (its registry row, when the row expires).
        self.workers: dict[str, tuple[WorkerInfo, datetime]] = {}
        # Job name -> (tier, bucket start) -> outcome counts.
        self.counters: dict[str, dict[_CounterKey, _Counts]] = {}
        # The last minute bucket counted into: (its start, its end, its key). Most settles land
        # in the same minute as the one before, so the bucket is not recomputed per settle.
        self.minute: tuple[datetime, datetime, _CounterKey] | None = None

    def now(self) -> datetime:
        """Answer the clock's instant, refusing every call once the driver is closed."""
        if self.closed:
            raise DriverUnavailableError("the memory driver is closed", driver="memory")
        return self.clock.now()

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def file(self, row: _Row, at: datetime) -> None:
        """Give ``row`` a fresh pending entry at ``at``, invalidating every older entry."""
        row.token += 1
        heapq.heappush(self.queues[row.queue].pending, (at, row.seq, row.token, row))

    @staticmethod
    def first_pending(queue: _Queue) -> datetime | None:
        """Answer the instant of ``queue``'s first valid pending entry (stale ones are dropped).

        It may come before the row's real instant when a heartbeat moved a lease on since the
        entry was filed (see :meth:`claimable_at`).
        """
        pending = queue.pending
        while pending and pending[0][2] != pending[0][3].token:
            heapq.heappop(pending)
        return pending[0][0] if pending else None

    @staticmethod
    def claimable_at(queue: _Queue, now: datetime) -> datetime | None:
        """Answer when a row of ``queue`` becomes claimable (``now`` when one is), or ``None``.

        Stale entries are dropped on the way and an entry a heartbeat overtook is filed again at
        its row's lease expiry, as a claim would do.
        """
        due = queue.due
        while due and due[0][3] != due[0][4].token:
            heapq.heappop(due)
        if due:
            return now
        pending = queue.pending
        while (first := _Memory.first_pending(queue)) is not None:
            _, seq, token, row = pending[0]
            at = row.visible_at if row.state is JobState.RUNNING else row.run_at
            if at is None or at <= first:
                return first
            heapq.heapreplace(pending, (at, seq, token, row))
        return None

    def finish(self, row: _Row, state: JobState, now: datetime, duration_ms: float = 0.0) -> None:
        """Settle ``row`` in a finished state: it leaves the heaps and frees its live key.

        ``done``, ``failed`` and ``dead`` add to the job's counters (``duration_ms`` with
        ``done``).
        """
        row.state = state
        row.updated_at = now
        row.token += 1
        del self.live[row.id]
        key = _live_key(row)
        if self.keys.get(key) is row:
            del self.keys[key]
        counts = self.queues[row.queue].finished
        counts[state] = counts.get(state, 0) + 1
        self.settled.setdefault(state, {})[row.id] = row
        outcome = _COUNTED.get(state)
        if outcome is not None:
            self.count(row.name, outcome, now, duration_ms)

    def count(self, name: str, outcome: str, now: datetime, duration_ms: float = 0.0) -> None:
        """Add one ``outcome`` (``done``/``retried``/``failed``/``dead``) to its minute bucket."""
        per_name = self.counters.setdefault(name, {})
        minute = self.minute
        if minute is not None and minute[0] <= now < minute[1]:
            key = minute[2]
        else:
            start = _floor(now, _TIER_WIDTH["1m"])
            key = ("1m", start)
            self.minute = (start, start + _TIER_WIDTH["1m"], key)
        counts = per_name.get(key)
        if counts is None:
            counts = per_name[key] = _Counts()
        setattr(counts, outcome, getattr(counts, outcome) + 1)
        counts.duration_ms += duration_ms

    def requeue(self, row: _Row, from_step: str | None, now: datetime) -> None:
        """Make a finished row ``ready`` now with a fresh attempt budget (see ``requeue``).

        Raises:
            JobNotRequeueableError: ``X_JOB_NOT_REQUEUEABLE`` for a live row.
            JobDuplicateError: ``X_JOB_DUPLICATE`` when another live row holds its key.
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a ``from_step`` the run
                has no record of.
        """
        if row.state in LIVE_STATES:
            raise JobNotRequeueableError(
                f"job {row.id} is still live ({row.state}); cancel it first to requeue it",
                job_id=str(row.id),
                state=str(row.state),
            )
        key = _live_key(row)
        holder = self.keys.get(key)
        if holder is not None:
            raise JobDuplicateError(
                f"job {holder.id} is live with the same key {row.idempotency_key!r}",
                job_id=str(row.id),
                holder=str(holder.id),
            )
        run = self.steps.get(row.run_id, {})
        if from_step is not None:
            start = run.get(from_step)
            if start is None:
                raise DriverRequestInvalidError(
                    f"job {row.id} has no step named {from_step!r}",
                    job_id=str(row.id),
                    step=from_step,
                )
            cut = start.record.seq
            for name in [n for n, step in run.items() if step.record.seq >= cut]:
                del run[name]
        self.queues[row.queue].finished[row.state] -= 1
        self.settled[row.state].pop(row.id, None)
        row.state = JobState.READY
        row.attempts = 0
        row.run_at = now
        row.visible_at = None
        row.result = "null"
        row.progress = "null"
        row.updated_at = now
        row.debounced = False  # a requeued row holds its key like any other
        self.live[row.id] = row
        self.keys[key] = row
        self.file(row, now)

    def promote(self, row: _Row, now: datetime) -> None:
        """Make a waiting row due now (a ``delayed`` one becomes ``ready``).

        Raises:
            JobNotPromotableError: ``X_JOB_NOT_PROMOTABLE`` unless the row is ``delayed`` or
                ``suspended`` with its ``run_at`` ahead.
        """
        if not self.promotable(row, now):
            raise JobNotPromotableError(
                f"job {row.id} is not waiting on run_at ({row.state}, due {row.run_at})",
                job_id=str(row.id),
                state=str(row.state),
            )
        if row.state is JobState.DELAYED:
            row.state = JobState.READY
        row.run_at = now
        row.updated_at = now
        self.file(row, now)

    @staticmethod
    def promotable(row: _Row, now: datetime) -> bool:
        return row.state in _WAITING and row.run_at > now

    def requeueable(self, row: _Row) -> bool:
        """Whether a bulk requeue takes ``row``: finished, and no live row holds its key."""
        return row.state not in LIVE_STATES and _live_key(row) not in self.keys

    def drop(self, row: _Row) -> None:
        """Delete a non-running row and its run's steps; the caller removes it from ``listing``."""
        del self.rows[row.id]
        if self.runs.get(row.run_id) is row:
            del self.runs[row.run_id]
        if row.id in self.live:
            del self.live[row.id]
            key = _live_key(row)
            if self.keys.get(key) is row:
                del self.keys[key]
            row.token += 1  # its heap entries are stale from now on
        else:
            self.queues[row.queue].finished[row.state] -= 1
            self.settled[row.state].pop(row.id, None)
        self.steps.pop(row.run_id, None)
        if row.parent_run_id is not None:
            siblings = self.children.get(row.parent_run_id)
            if siblings is not None:
                siblings.pop(row.id, None)
                if not siblings:
                    del self.children[row.parent_run_id]

    def fenced(self, job_id: UUID, fence: Fence) -> _Row | None:
        """Answer the row if it is ``running`` under ``fence``, else ``None``."""
        row = self.rows.get(job_id)
        if (
            row is None
            or row.state is not JobState.RUNNING
            or row.claimed_by != fence.worker_id
            or row.claim != fence.claim
        ):
            return None
        return row

    def step_records(self, run_id: UUID) -> list[StepRecord]:
        """Answer a run's steps in ``seq`` order, JSON fields decoded afresh."""
        stored = sorted(self.steps.get(run_id, {}).values(), key=lambda s: s.record.seq)
        return [
            replace(
                step.record,
                output=json.loads(step.output),
                match=None if step.match is None else json.loads(step.match),
            )
            for step in stored
        ]

    def info(self, row: _Row, *, with_steps: bool) -> JobInfo:
        """Answer ``row`` as the operator surface shows it."""
        return JobInfo(
            id=row.id,
            run_id=row.run_id,
            name=row.name,
            queue=row.queue,
            state=row.state,
            attempt=row.attempts,
            max_attempts=row.max_attempts,
            claim=row.claim,
            tenant_id=row.tenant_id,
            idempotency_key=row.idempotency_key,
            input=json.loads(row.input),
            run_at=row.run_at,
            created_at=row.created_at,
            updated_at=row.updated_at,
            claimed_by=row.claimed_by,
            last_error=row.last_error,
            last_error_code=row.last_error_code,
            last_error_stack=row.last_error_stack,
            result=json.loads(row.result),
            progress=json.loads(row.progress),
            enqueued_by=row.enqueued_by,
            traceparent=row.traceparent,
            steps=tuple(self.step_records(row.run_id)) if with_steps else (),
            priority=row.priority,
            parent_run_id=row.parent_run_id,
        )

    def notify(self, queues: Iterable[str]) -> None:
        """Tell every wake subscriber, on its own loop, that ``queues`` may have due work.

        Called without the lock held, so a subscriber's loop is never blocked on it.
        """
        names = sorted(set(queues))
        if not names:
            return
        with self.lock:
            subscribers = list(self.subscribers.items())
        for token, (loop, callback) in subscribers:
            try:
                for name in names:
                    loop.call_soon_threadsafe(callback, name)
            except RuntimeError:
                # The subscriber's loop is closed: it can never be told again.
                with self.lock:
                    self.subscribers.pop(token, None)


class MemoryStepStore:
    """The memory driver's :class:`~jobs_core.driver.StepStore`.

    Records are kept per run; ``seq`` is assigned on first insert and kept on replacement.

    Args:
        memory: the driver's shared state.
    """

    def __init__(self, memory: _Memory) -> None:
        """Serve ``memory`` (the arguments are described in the class docstring)."""
        self._m = memory

    async def load(self, run_id: UUID) -> list[StepRecord]:
        """Answer every step of a run in ``seq`` order (empty for a new run).

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        with self._m.lock:
            self._m.now()
            return self._m.step_records(run_id)

    async def write(self, write: StepWrite) -> bool:
        """Insert or replace one step record (by ``run_id`` and name), fenced like an ack.

        A write carrying ``job_id`` and ``fence`` lands only while that row is ``running`` under
        the fence and belongs to ``write.run_id``; one carrying neither (``run_inline``) always
        lands. A first insert gets ``seq`` one past the run's highest (its step count while no
        step was deleted by :meth:`MemoryIntrospector.resolve_step`); a replacement keeps it.

        Returns:
            ``True`` when written; ``False``, writing nothing, when the fence does not hold.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a write carrying only one
                of ``job_id`` and ``fence``, or an output or match that is not JSON.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        record = write.record
        output = _encode(record.output, "step output")
        match = None if record.match is None else _encode(dict(record.match), "step match")
        with self._m.lock:
            self._m.now()
            if write.job_id is not None and write.fence is not None:
                row = self._m.fenced(write.job_id, write.fence)
                if row is None or row.run_id != write.run_id:
                    return False
            elif write.job_id is not None or write.fence is not None:
                raise DriverRequestInvalidError(
                    "a step write carries both job_id and fence, or neither (run_inline)",
                    job_id=None if write.job_id is None else str(write.job_id),
                )
            run = self._m.steps.setdefault(write.run_id, {})
            previous = run.get(record.name)
            if previous is not None:
                seq = previous.record.seq
            else:
                seq = max((step.record.seq for step in run.values()), default=-1) + 1
            run[record.name] = _Step(
                record=_bare(record, seq),
                output=output,
                match=match,
                match_value=None if match is None else json.loads(match),
            )
            return True

    async def now(self) -> datetime:
        """Answer the driver clock's current instant (UTC)."""
        with self._m.lock:
            return self._m.now()


class MemoryIntrospector:
    """The memory driver's :class:`~jobs_core.driver.Introspector` (the operator surface).

    ``JobInfo.state`` is the stored state: a ``delayed`` row whose ``run_at`` has passed still
    shows ``delayed`` until it is claimed (:meth:`MemoryDriver.stats` counts it as ready).
    ``JobInfo.attempt`` is the number of attempts spent so far: ``0`` while the first attempt
    runs, and after a settle the number the row used.

    Args:
        memory: the driver's shared state.
    """

    def __init__(self, memory: _Memory) -> None:
        """Serve ``memory`` (the arguments are described in the class docstring)."""
        self._m = memory

    async def get(self, job_id: UUID) -> JobInfo | None:
        """Answer one job with its step trace (in ``seq`` order), or ``None`` for an unknown id.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        with self._m.lock:
            self._m.now()
            row = self._m.rows.get(job_id)
            return None if row is None else self._m.info(row, with_steps=True)

    async def cancel(self, job_id: UUID, reason: str) -> JobInfo:
        """Cancel a live job: it is ``cancelled`` now and frees its idempotency key.

        A running row's attempt is counted (it ran; ``jobsctl ls`` shows ``1/3``, not ``0/3``).

        A running row's next ack, nack, heartbeat, progress or step write answers ``False``, so
        the worker fires the body's cancel signal. ``last_error`` becomes ``reason`` and
        ``last_error_code`` ``X_JOB_CANCELLED``.

        Returns:
            The cancelled job, with its steps.

        Raises:
            JobNotFoundError: ``X_JOB_NOT_FOUND``.
            JobNotCancellableError: ``X_JOB_NOT_CANCELLABLE`` for a finished row.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        with self._m.lock:
            now = self._m.now()
            row = self._m.rows.get(job_id)
            if row is None:
                raise JobNotFoundError(f"no job has id {job_id}", job_id=str(job_id))
            if row.state not in LIVE_STATES:
                raise JobNotCancellableError(
                    f"job {job_id} already finished ({row.state})",
                    job_id=str(job_id),
                    state=str(row.state),
                )
            row.last_error = reason
            row.last_error_code = JobCancelledError.code
            row.last_error_stack = None
            if row.state is JobState.RUNNING:
                # The attempt the cancel stopped ran: it is spent, as a settle would count it.
                row.attempts += 1
            self._m.finish(row, JobState.CANCELLED, now)
            return self._m.info(row, with_steps=True)

    async def resolve_step(self, job_id: UUID, step: str, resolution: StepResolution) -> None:
        """Settle a ``once`` step left ``started``: ``ran`` completes it, else it is deleted.

        A completed step gets ``resolution.output`` and ``completed_at`` now; a deleted step
        leaves the other steps' ``seq`` unchanged, so the next attempt runs it again.

        Raises:
            JobNotFoundError: ``X_JOB_NOT_FOUND``.
            StepNotResolvableError: ``X_STEP_NOT_RESOLVABLE`` unless the step is a ``once`` step
                in ``started``.
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an output that is not
                JSON.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        output = _encode(resolution.output, "step output")
        with self._m.lock:
            now = self._m.now()
            row = self._m.rows.get(job_id)
            if row is None:
                raise JobNotFoundError(f"no job has id {job_id}", job_id=str(job_id))
            run = self._m.steps.get(row.run_id, {})
            stored = run.get(step)
            if stored is None or not (stored.record.once and stored.record.status == "started"):
                raise StepNotResolvableError(
                    f"step {step!r} of job {job_id} is not a once step left started",
                    job_id=str(job_id),
                    step=step,
                    status=None if stored is None else stored.record.status,
                )
            if resolution.ran:
                stored.record = replace(stored.record, status="completed", completed_at=now)
                stored.output = output
            else:
                del run[step]

    async def record_progress(self, job_id: UUID, fence: Fence, progress: JSONValue) -> bool:
        """Store a running job's progress (JSON); fenced like an ack.

        Returns:
            ``True`` when stored; ``False`` when the row is not ``running`` under ``fence``.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a value that is not JSON.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        text = _encode(progress, "progress")
        with self._m.lock:
            now = self._m.now()
            row = self._m.fenced(job_id, fence)
            if row is None:
                return False
            row.progress = text
            row.updated_at = now
            return True

    async def pause_queue(self, queue: str) -> None:
        """Stop every claim from ``queue`` from its next call on; enqueues still land.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        with self._m.lock:
            self._m.now()
            self._m.paused.add(queue)

    async def resume_queue(self, queue: str) -> None:
        """Let claims take rows from ``queue`` again, and wake subscribers for it.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        with self._m.lock:
            self._m.now()
            was_paused = queue in self._m.paused
            self._m.paused.discard(queue)
        if was_paused:
            self._m.notify([queue])

    async def paused_queues(self) -> list[str]:
        """Answer the paused queues, sorted.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        with self._m.lock:
            self._m.now()
            return sorted(self._m.paused)

    async def requeue(self, job_id: UUID, from_step: str | None = None) -> JobInfo:
        """Queue a finished job again: ``ready`` now, ``attempt`` 0, same run and claim ordinal.

        Its result and progress are cleared; its last error is kept for the record. Without
        ``from_step`` every step record is kept, so the run replays them (a dead saga's finished
        compensators are not run again); with it, that step and every later one (by ``seq``) are
        deleted under the same lock as the state change.

        Returns:
            The requeued job, with its remaining steps.

        Raises:
            JobNotFoundError: ``X_JOB_NOT_FOUND``.
            JobNotRequeueableError: ``X_JOB_NOT_REQUEUEABLE`` for a live row.
            JobDuplicateError: ``X_JOB_DUPLICATE`` when another live row holds its key.
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a ``from_step`` the run
                has no record of (nothing changes).
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        with self._m.lock:
            now = self._m.now()
            row = self._row(job_id)
            self._m.requeue(row, from_step, now)
            job = self._m.info(row, with_steps=True)
        self._m.notify([job.queue])
        return job

    async def remove(self, job_id: UUID) -> None:
        """Delete a job that is not running, with its run's steps; a live one frees its key.

        Raises:
            JobNotFoundError: ``X_JOB_NOT_FOUND``.
            JobNotRemovableError: ``X_JOB_NOT_REMOVABLE`` for a ``running`` row.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        with self._m.lock:
            self._m.now()
            row = self._row(job_id)
            if row.state is JobState.RUNNING:
                raise JobNotRemovableError(
                    f"job {job_id} is running; cancel it first", job_id=str(job_id)
                )
            self._m.drop(row)
            listing = self._m.listing
            del listing[bisect_left(listing, _position(row), key=_position)]

    async def promote(self, job_id: UUID) -> JobInfo:
        """Make a ``delayed`` or ``suspended`` row whose ``run_at`` is ahead due now.

        A ``delayed`` row becomes ``ready``; a ``suspended`` one stays ``suspended`` and is
        claimed at once (a waiting step that finds nothing parks again).

        Returns:
            The promoted job, with its steps.

        Raises:
            JobNotFoundError: ``X_JOB_NOT_FOUND``.
            JobNotPromotableError: ``X_JOB_NOT_PROMOTABLE`` for any other row.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        with self._m.lock:
            now = self._m.now()
            row = self._row(job_id)
            self._m.promote(row, now)
            job = self._m.info(row, with_steps=True)
        self._m.notify([job.queue])
        return job

    async def requeue_many(self, flt: JobFilter) -> BulkResult:
        """Requeue up to ``BULK_LIMIT`` finished rows matching ``flt``, newest first.

        Each is requeued as :meth:`requeue` without ``from_step``. A row whose key a live row
        holds (another row, or one requeued earlier in this call) stays and is not counted in
        ``remaining``. ``flt.limit``, ``flt.after`` and ``flt.before`` are ignored.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive
                ``created_from``/``created_to``.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        m = self._m
        return self._bulk(
            flt,
            lambda row, now: m.requeueable(row),
            lambda row, now: m.requeue(row, None, now),
        )

    async def remove_many(self, flt: JobFilter) -> BulkResult:
        """Remove up to ``BULK_LIMIT`` rows matching ``flt`` that are not running, newest first.

        As :meth:`remove` for each; ``flt.limit``, ``flt.after`` and ``flt.before`` are ignored.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive
                ``created_from``/``created_to``.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        removed: set[UUID] = set()

        def remove(row: _Row, now: datetime) -> None:
            self._m.drop(row)
            removed.add(row.id)

        def relist() -> None:
            # One rebuild rather than a list deletion per row.
            if removed:
                self._m.listing = [row for row in self._m.listing if row.id not in removed]

        return self._bulk(flt, lambda row, now: row.state is not JobState.RUNNING, remove, relist)

    async def promote_many(self, flt: JobFilter) -> BulkResult:
        """Promote up to ``BULK_LIMIT`` waiting rows matching ``flt``, newest first.

        As :meth:`promote` for each; ``flt.limit``, ``flt.after`` and ``flt.before`` are ignored.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive
                ``created_from``/``created_to``.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        return self._bulk(flt, self._m.promotable, self._m.promote)

    def _row(self, job_id: UUID) -> _Row:
        """Answer the row with ``job_id`` (the caller holds the lock), or raise not found."""
        row = self._m.rows.get(job_id)
        if row is None:
            raise JobNotFoundError(f"no job has id {job_id}", job_id=str(job_id))
        return row

    def _bulk(
        self,
        flt: JobFilter,
        eligible: Callable[[_Row, datetime], bool],
        apply: Callable[[_Row, datetime], None],
        then: Callable[[], None] | None = None,
    ) -> BulkResult:
        """Apply ``apply`` to up to ``BULK_LIMIT`` eligible rows matching ``flt``, newest first.

        Eligibility is checked just before each row is changed, so a change earlier in the call
        (a key taken by a requeue) counts; ``then`` runs under the same lock after the last
        change, and ``remaining`` is counted after it.
        """
        keep = _row_filter(flt)
        woken: set[str] = set()
        with self._m.lock:
            now = self._m.now()
            affected = 0
            for row in reversed(list(self._m.listing)):
                if affected == BULK_LIMIT:
                    break
                if keep(row) and eligible(row, now):
                    apply(row, now)
                    affected += 1
                    woken.add(row.queue)
            if then is not None:
                then()
            remaining = sum(1 for row in self._m.rows.values() if keep(row) and eligible(row, now))
        self._m.notify(woken)
        return BulkResult(affected=affected, remaining=remaining)

    # Last in the class: inside this class body ``list`` names this method.
    async def list(self, flt: JobFilter) -> JobPage:
        """Answer one page of jobs, newest first by ``(created_at, id)``, without step traces.

        Filters combine with AND; ``id_prefix`` is compared with the id's lowercase text and
        ``created_to`` is exclusive. ``after=`` answers rows older than the cursor's position and
        ``before=`` rows newer than it (the page is still newest first). A cursor is a position,
        not a row, so it stays valid whatever happens to the row it came from.

        Returns:
            The page; ``next`` is the last row's cursor when older rows match, ``prev`` the first
            row's cursor when newer rows match (both ``None`` for an empty page).

        Raises:
            JobPageInvalidError: ``X_JOB_PAGE_INVALID`` for ``limit`` outside 1..200, a cursor
                this driver did not issue, or both ``after`` and ``before``.
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive
                ``created_from``/``created_to``.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        limit = flt.limit
        if not 1 <= limit <= MAX_JOB_PAGE:
            raise JobPageInvalidError(
                f"limit must be 1..{MAX_JOB_PAGE}, got {limit}", limit=limit, max=MAX_JOB_PAGE
            )
        if flt.after is not None and flt.before is not None:
            raise JobPageInvalidError("pass after= or before=, not both")
        after = None if flt.after is None else _cursor_position(flt.after)
        before = None if flt.before is None else _cursor_position(flt.before)
        keep = _row_filter(flt)
        with self._m.lock:
            self._m.now()
            rows = self._m.listing

            def index(row: _Row) -> int:
                return bisect_left(rows, _position(row), key=_position)

            if before is not None:
                found = list(
                    islice(_newer(rows, bisect_right(rows, before, key=_position), keep), limit + 1)
                )
                more_newer = len(found) > limit
                page = found[:limit][::-1]
                more_older = (
                    bool(page) and next(_older(rows, index(page[-1]), keep), None) is not None
                )
            else:
                stop = len(rows) if after is None else bisect_left(rows, after, key=_position)
                found = list(islice(_older(rows, stop, keep), limit + 1))
                more_older = len(found) > limit
                page = found[:limit]
                more_newer = (
                    after is not None
                    and bool(page)
                    and next(_newer(rows, index(page[0]) + 1, keep), None) is not None
                )
            return JobPage(
                rows=tuple(self._m.info(row, with_steps=False) for row in page),
                next=_cursor(page[-1]) if more_older else None,
                prev=_cursor(page[0]) if more_newer else None,
            )


class MemoryChildJobs:
    """The memory driver's :class:`~jobs_core.driver.ChildJobs`: rows by their parent's run.

    Args:
        memory: the driver's shared state.
    """

    def __init__(self, memory: _Memory) -> None:
        """Serve ``memory`` (the arguments are described in the class docstring)."""
        self._m = memory

    async def children(self, run_id: UUID, ids: Sequence[UUID] | None = None) -> list[JobInfo]:
        """Answer the child rows of run ``run_id`` (only ``ids`` when given), in enqueue order.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        with self._m.lock:
            self._m.now()
            rows = self._m.children.get(run_id, {})
            if ids is None:
                picked = list(rows.values())
            else:
                picked = [row for row in map(rows.get, dict.fromkeys(ids)) if row is not None]
            picked.sort(key=_position)
            return [self._m.info(row, with_steps=False) for row in picked]


class MemoryLeaseStore:
    """The memory driver's :class:`~jobs_core.driver.LeaseStore`: slots per key with expiry.

    A key's slots are kept in acquisition order; a slot whose ``expires_at`` has passed is free.

    Args:
        memory: the driver's shared state.
    """

    def __init__(self, memory: _Memory) -> None:
        """Serve ``memory`` (the arguments are described in the class docstring)."""
        self._m = memory

    def _live_slots(self, key: str, now: datetime) -> list[_Slot]:
        """Drop ``key``'s expired slots and answer the rest (the caller holds the lock)."""
        slots = [slot for slot in self._m.leases.get(key, ()) if slot.expires_at > now]
        if slots:
            self._m.leases[key] = slots
        else:
            self._m.leases.pop(key, None)
        return slots

    async def acquire(self, req: LeaseRequest) -> bool:
        """Take a slot of ``req.key`` for ``req.holder`` until now plus ``req.ttl_ms``.

        A holder that already holds a live slot has it renewed (always ``True``).

        Returns:
            ``True`` when held; ``False`` when ``req.limit`` other holders hold live slots.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for ``limit`` or ``ttl_ms``
                below 1.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        if req.limit < 1 or req.ttl_ms < 1:
            raise DriverRequestInvalidError(
                "a lease needs limit >= 1 and ttl_ms >= 1", limit=req.limit, ttl_ms=req.ttl_ms
            )
        with self._m.lock:
            now = self._m.now()
            until = _plus_ms(now, req.ttl_ms, "ttl_ms")
            slots = self._live_slots(req.key, now)
            for slot in slots:
                if slot.holder == req.holder:
                    slot.expires_at = until
                    return True
            if len(slots) >= req.limit:
                return False
            slots.append(_Slot(req.holder, until))
            self._m.leases[req.key] = slots
            return True

    async def renew(self, req: LeaseRequest) -> bool:
        """Extend ``req.holder``'s live slot of ``req.key`` to now plus ``req.ttl_ms``.

        Returns:
            ``True`` when renewed; ``False`` when it holds no live slot (expired or released).

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for ``ttl_ms`` below 1.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        if req.ttl_ms < 1:
            raise DriverRequestInvalidError("a lease needs ttl_ms >= 1", ttl_ms=req.ttl_ms)
        with self._m.lock:
            now = self._m.now()
            until = _plus_ms(now, req.ttl_ms, "ttl_ms")
            for slot in self._live_slots(req.key, now):
                if slot.holder == req.holder:
                    slot.expires_at = until
                    return True
            return False

    async def release(self, key: str, holder: str) -> None:
        """Free ``holder``'s slot of ``key`` (nothing happens if it holds none).

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        with self._m.lock:
            now = self._m.now()
            slots = [slot for slot in self._live_slots(key, now) if slot.holder != holder]
            if slots:
                self._m.leases[key] = slots
            else:
                self._m.leases.pop(key, None)

    async def holders(self, key: str) -> list[str]:
        """Answer the holders of ``key``'s live slots, in acquisition order.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        with self._m.lock:
            now = self._m.now()
            return [slot.holder for slot in self._live_slots(key, now)]


class MemoryEventBus:
    """The memory driver's :class:`~jobs_core.driver.EventBus`; it wakes waiters.

    A publish stores the event and makes every ``suspended`` row due now whose run has a
    ``waiting`` step for that event name whose ``match`` the payload satisfies (top-level key
    equality), then wakes subscribers for those rows' queues. It scans the live rows to find
    them: publishes are rare next to claims. A waiting step records no correlation key, so a
    publish wakes its waiters whatever key they wait on; a woken run that :meth:`find` does not
    satisfy parks again, so such a wake costs one claim and changes nothing.

    A publish lands at once: there is no transaction here for it to join (a
    :class:`~jobs_core.outbox.MemoryTransaction` holds only staged enqueues). :meth:`reset` makes
    it a :class:`~jobs_core.driver.ResettableEventBus`.

    Attributes:
        wakes_waiters: always ``True``.

    Args:
        memory: the driver's shared state.
    """

    wakes_waiters: bool = True

    def __init__(self, memory: _Memory) -> None:
        """Serve ``memory`` (the arguments are described in the class docstring)."""
        self._m = memory

    async def publish(self, req: PublishRequest) -> StoredEvent:
        """Store an event, matchable until now plus ``req.ttl_ms``, and wake its waiting runs.

        Returns:
            The stored event (``published_at`` is the driver clock's now).

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a payload that is not JSON
                or a ``ttl_ms`` out of range.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        payload = _encode(req.payload, "payload")
        woken: set[str] = set()
        with self._m.lock:
            now = self._m.now()
            event = _Event(
                id=new_id(),
                name=req.name,
                payload=payload,
                payload_value=json.loads(payload),
                correlation_key=req.correlation_key,
                published_at=now,
                expires_at=_plus_ms(now, req.ttl_ms, "ttl_ms"),
                seq=self._m.next_seq(),
            )
            self._m.events.setdefault(req.name, []).append(event)
            for row in self._m.live.values():
                if row.state is JobState.RUNNING and self._waits_for(row, event):
                    # The run may be between its last look and its park: the park must not sleep
                    # through this event until the backstop.
                    row.wake_pending = True
                elif (
                    row.state is JobState.SUSPENDED
                    and row.run_at > now
                    and self._waits_for(row, event)
                ):
                    row.run_at = now
                    row.updated_at = now
                    self._m.file(row, now)
                    woken.add(row.queue)
            stored = event.stored()
        self._m.notify(woken)
        return stored

    def _waits_for(self, row: _Row, event: _Event) -> bool:
        """Answer whether ``row``'s run has a waiting step ``event`` satisfies."""
        return any(
            step.record.status == "waiting"
            and step.record.event == event.name
            and _payload_matches(step.match_value, event.payload_value)
            for step in self._m.steps.get(row.run_id, {}).values()
        )

    async def find(self, query: EventQuery) -> StoredEvent | None:
        """Answer the earliest unexpired event matching ``query``, or ``None``.

        Earliest is by ``published_at``, then publish order. An event matches when it has the
        name, was published at or after ``query.since``, carries ``query.correlation_key`` when one
        is given, and its payload has every ``query.match`` key with an equal JSON value (the
        match is compared in its JSON form: a tuple equals a list, ``True`` never equals ``1``).

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive ``since`` or a
                match that is not JSON.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        since = _utc(query.since, "since")
        match = None if query.match is None else json.loads(_encode(dict(query.match), "match"))
        with self._m.lock:
            now = self._m.now()
            best: _Event | None = None
            for event in self._m.events.get(query.name, ()):
                if (
                    event.expires_at > now
                    and event.published_at >= since
                    and (
                        query.correlation_key is None
                        or event.correlation_key == query.correlation_key
                    )
                    and _payload_matches(match, event.payload_value)
                    and (
                        best is None
                        or (event.published_at, event.seq) < (best.published_at, best.seq)
                    )
                ):
                    best = event
            return None if best is None else best.stored()

    async def now(self) -> datetime:
        """Answer the driver clock's current instant (UTC): the bus's one clock."""
        with self._m.lock:
            return self._m.now()

    async def purge_expired(self) -> int:
        """Delete every event whose ``expires_at`` has passed; answer how many.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        with self._m.lock:
            now = self._m.now()
            purged = 0
            for name in list(self._m.events):
                kept = [event for event in self._m.events[name] if event.expires_at > now]
                purged += len(self._m.events[name]) - len(kept)
                if kept:
                    self._m.events[name] = kept
                else:
                    del self._m.events[name]
            return purged

    async def reset(self) -> int:
        """Delete every event, expired or not; answer how many (``reset_event_bus``'s seam).

        Waiting steps and their runs are untouched: they match only events published later.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        with self._m.lock:
            self._m.now()
            deleted = sum(len(events) for events in self._m.events.values())
            self._m.events.clear()
            return deleted


class MemoryWakeSource:
    """The memory driver's :class:`~jobs_core.driver.WakeSource`.

    Subscribers hear a queue's name when a due row lands in it (an enqueue, a nack or park due
    now, a publish that wakes a waiting run), when it is resumed, and when an enqueue brings a row
    for later that comes before every other pending instant of its queue. Rows that become due by
    the passing of time are not announced: :meth:`next_due_ms` tells an idle worker when.

    Args:
        memory: the driver's shared state.
    """

    def __init__(self, memory: _Memory) -> None:
        """Serve ``memory`` (the arguments are described in the class docstring)."""
        self._m = memory

    async def subscribe(self, callback: Callable[[str], None]) -> Callable[[], Awaitable[None]]:
        """Call ``callback(queue)`` on the calling task's event loop whenever work may be due.

        Returns:
            An async function that ends the subscription (safe to call twice, and after close).

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        loop = asyncio.get_running_loop()
        with self._m.lock:
            self._m.now()
            token = self._m.next_seq()
            self._m.subscribers[token] = (loop, callback)

        async def unsubscribe() -> None:
            with self._m.lock:
                self._m.subscribers.pop(token, None)

        return unsubscribe

    async def next_due_ms(self, queues: Sequence[str]) -> int | None:
        """Answer the milliseconds (rounded up) until a row of ``queues`` becomes claimable.

        ``0`` when one is now; ``None`` when none waits. Paused queues are left out; a running
        row's lease expiry counts (a lapsed lease makes its row claimable).

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        with self._m.lock:
            now = self._m.now()
            instants = [
                self._m.claimable_at(self._m.queues[name], now)
                for name in dict.fromkeys(queues)
                if name in self._m.queues and name not in self._m.paused
            ]
        first = min((at for at in instants if at is not None), default=None)
        if first is None:
            return None
        # Rounded up: a worker woken on the rounded-down instant would find the row not yet due.
        return max(0, -((now - first) // timedelta(milliseconds=1)))


def _forward(task: str, expected: datetime | None, to: datetime, what: str) -> datetime:
    """Answer ``to`` in UTC, refusing a move that is not past ``expected`` (never backwards)."""
    moved = _utc(to, what)
    check_watermark_forward(
        task, None if expected is None else _utc(expected, "expected"), moved, what
    )
    return moved


class MemorySchedulerState:
    """The memory driver's :class:`~jobs_core.driver.SchedulerState`.

    A fire compares the watermark, inserts its rows through the driver's own enqueue path
    (dedupe on live keys and explicit ids) and moves the watermark under the driver's one lock,
    with no await in between, so no other caller (a second scheduler's fire, a claim, an
    operator) ever sees the rows without the watermark or the reverse.

    Args:
        driver: the driver whose rows the fires insert.
    """

    def __init__(self, driver: MemoryDriver) -> None:
        """Serve ``driver`` (the arguments are described in the class docstring)."""
        self._driver = driver
        self._m = driver._m

    async def watermarks(self) -> dict[str, datetime]:
        """Answer every task's watermark (UTC) by task name.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        with self._m.lock:
            self._m.now()
            return dict(self._m.watermarks)

    async def fire(self, fire: TaskFire) -> list[EnqueueResult] | None:
        """Enqueue ``fire.requests`` and move the watermark, only if it is ``fire.expected``.

        Returns:
            The enqueue results in request order; ``None``, writing nothing, when the stored
            watermark is not ``fire.expected`` (another scheduler fired first).

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID``, writing nothing, for an empty
                task name, a naive instant, an occurrence not after ``fire.expected``, a
                ``fire.watermark`` before the occurrence, or a request :meth:`MemoryDriver.enqueue`
                refuses.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        task = check_task_name(fire.task)
        occurrence = _forward(task, fire.expected, fire.occurrence, "occurrence")
        watermark = occurrence if fire.watermark is None else _utc(fire.watermark, "watermark")
        if watermark < occurrence:
            raise DriverRequestInvalidError(
                f"task {task!r}: the watermark {watermark.isoformat()} is before the occurrence "
                f"{occurrence.isoformat()} it fires",
                task=task,
            )
        driver = self._driver
        inputs = [driver._checked_input(req) for req in fire.requests]
        check_run_ids(fire.requests)
        woken: set[str] = set()
        with self._m.lock:
            now = self._m.now()
            if self._m.watermarks.get(task) != fire.expected:
                return None
            # Every due instant and run id is checked before the first insert so a bad one
            # writes nothing.
            due = [driver._due_at(req, now) for req in fire.requests]
            driver._check_runs(fire.requests)
            results = [
                driver._insert(req, text, run_at, now, woken)
                for req, text, run_at in zip(fire.requests, inputs, due, strict=True)
            ]
            self._m.watermarks[task] = watermark
            self._m.task_fires[task] = TaskFireRecord(
                task=task,
                occurrence=occurrence,
                watermark=watermark,
                fired_at=now,
                job_ids=tuple(result.id for result in results),
                cron=fire.cron,
                tz=fire.tz,
            )
        self._m.notify(woken)
        return results

    async def advance(self, task: str, expected: datetime | None, to: datetime) -> bool:
        """Move ``task``'s watermark to ``to`` without firing, only if it is ``expected``.

        Returns:
            ``True`` when moved; ``False``, writing nothing, when the stored watermark is not
            ``expected``.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty task name, a
                naive ``to``, or a ``to`` not after ``expected``.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        name = check_task_name(task)
        moved = _forward(name, expected, to, "to")
        with self._m.lock:
            self._m.now()
            if self._m.watermarks.get(name) != expected:
                return False
            self._m.watermarks[name] = moved
            return True

    async def task_fires(self) -> list[TaskFireRecord]:
        """Answer the last fire of every task that ever fired, sorted by task name.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        with self._m.lock:
            self._m.now()
            return [self._m.task_fires[name] for name in sorted(self._m.task_fires)]

    async def paused_tasks(self) -> list[str]:
        """Answer the paused tasks, sorted.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        with self._m.lock:
            self._m.now()
            return sorted(self._m.paused_tasks)

    async def pause_task(self, task: str) -> None:
        """Stop dispatching ``task`` (its watermark stays where it is; pausing twice is fine).

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty task name.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        name = check_task_name(task)
        with self._m.lock:
            self._m.now()
            self._m.paused_tasks.add(name)

    async def resume_task(self, task: str) -> None:
        """Dispatch ``task`` again; its catch-up policy decides what it missed.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty task name.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        name = check_task_name(task)
        with self._m.lock:
            self._m.now()
            self._m.paused_tasks.discard(name)


class MemoryLeaderLease:
    """The memory driver's :class:`~jobs_core.driver.LeaderLease`: one lease with an expiry.

    The lease names its holder (a scheduler's incarnation id) and expires on the driver's clock;
    an expired lease is free to anyone, and its holder renews it by acquiring again.

    Args:
        memory: the driver's shared state.
    """

    def __init__(self, memory: _Memory) -> None:
        """Serve ``memory`` (the arguments are described in the class docstring)."""
        self._m = memory

    async def acquire(self, holder: str, ttl_ms: int) -> bool:
        """Take the lease for ``holder`` until now plus ``ttl_ms``, or renew it.

        Returns:
            ``True`` when ``holder`` holds it now (taken free, taken lapsed, or renewed);
            ``False`` when another holder's lease is unexpired.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty holder or
                ``ttl_ms`` below 1.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        if not isinstance(holder, str) or not holder or ttl_ms < 1:
            raise DriverRequestInvalidError(
                "the leader lease needs a non-empty holder and ttl_ms >= 1", ttl_ms=ttl_ms
            )
        with self._m.lock:
            now = self._m.now()
            until = _plus_ms(now, ttl_ms, "ttl_ms")
            lease = self._m.leader
            if lease is not None and lease.expires_at > now and lease.holder != holder:
                return False
            self._m.leader = _Slot(holder, until)
            return True

    async def release(self, holder: str) -> None:
        """Free the lease if ``holder`` holds it (nothing happens otherwise).

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        with self._m.lock:
            self._m.now()
            if self._m.leader is not None and self._m.leader.holder == holder:
                self._m.leader = None

    async def holder(self) -> str | None:
        """Answer the unexpired holder, or ``None`` when the lease is free or lapsed.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        with self._m.lock:
            now = self._m.now()
            lease = self._m.leader
            return lease.holder if lease is not None and lease.expires_at > now else None


class MemoryWorkerRegistry:
    """The memory driver's :class:`~jobs_core.driver.WorkerRegistry`: rows with an expiry.

    Args:
        memory: the driver's shared state.
    """

    def __init__(self, memory: _Memory) -> None:
        """Serve ``memory`` (the arguments are described in the class docstring)."""
        self._m = memory

    async def beat(self, info: WorkerInfo, ttl_ms: int) -> None:
        """Insert or replace ``info.id``'s row, expiring ``ttl_ms`` after now.

        The stored row's ``last_heartbeat`` is the driver clock's now and its ``in_flight`` is cut
        to the first 100 ids.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for ``ttl_ms`` below 1.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        if ttl_ms < 1:
            raise DriverRequestInvalidError("a worker row needs ttl_ms >= 1", ttl_ms=ttl_ms)
        with self._m.lock:
            now = self._m.now()
            row = replace(info, in_flight=tuple(info.in_flight[:100]), last_heartbeat=now)
            self._m.workers[info.id] = (row, _plus_ms(now, ttl_ms, "ttl_ms"))

    async def remove(self, worker_id: str) -> None:
        """Delete a worker's row (nothing happens if it has none).

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        with self._m.lock:
            self._m.now()
            self._m.workers.pop(worker_id, None)

    async def list(self) -> list[WorkerInfo]:
        """Answer the unexpired rows sorted by id, dropping the expired ones.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        with self._m.lock:
            now = self._m.now()
            workers = self._m.workers
            for worker_id in [w for w, (_, until) in workers.items() if until <= now]:
                del workers[worker_id]
            return [workers[worker_id][0] for worker_id in sorted(workers)]


class MemoryCounterStore:
    """The memory driver's :class:`~jobs_core.driver.CounterStore`.

    Settles add to the 1-minute bucket holding the driver clock's now (:meth:`MemoryDriver.ack`
    and :meth:`MemoryDriver.nack`, and burials in :meth:`MemoryDriver.claim`). Buckets are aligned
    on the Unix epoch. :meth:`rollup` folds whole groups, so the tiers never overlap in time: a
    1-minute bucket folds into its 5-minute bucket once that whole 5-minute bucket is more than
    24 h old, a 5-minute bucket into its hour once that whole hour is more than 7 d old, and an
    hour bucket is dropped once it is more than 30 d old.

    Args:
        memory: the driver's shared state.
    """

    def __init__(self, memory: _Memory) -> None:
        """Serve ``memory`` (the arguments are described in the class docstring)."""
        self._m = memory

    async def counters(self, name: str, since: datetime) -> list[CounterBucket]:
        """Answer ``name``'s buckets that end after ``since``, oldest first.

        At most ``MAX_COUNTER_ROWS`` (4,176), the newest: every bucket while :meth:`rollup` runs
        at least daily.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive ``since``.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        since = _utc(since, "since")
        with self._m.lock:
            self._m.now()
            found = [
                counts.bucket(name, tier, start)
                for (tier, start), counts in self._m.counters.get(name, {}).items()
                if start + _TIER_WIDTH[tier] > since
            ]
        found.sort(key=lambda bucket: bucket.bucket)
        return found[-MAX_COUNTER_ROWS:]

    async def totals(self, since: datetime) -> dict[str, CounterBucket]:
        """Answer, per job name with a bucket ending after ``since``, the sum of those buckets.

        Each total's ``bucket`` is ``since`` and its ``tier`` the coarsest tier summed.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive ``since``.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        since = _utc(since, "since")
        order: tuple[CounterTier, ...] = ("1m", "5m", "1h")
        totals: dict[str, CounterBucket] = {}
        with self._m.lock:
            self._m.now()
            for name in sorted(self._m.counters):
                summed = _Counts()
                tiers: set[CounterTier] = set()
                for (tier, start), counts in self._m.counters[name].items():
                    if start + _TIER_WIDTH[tier] > since:
                        summed.add(counts)
                        tiers.add(tier)
                if tiers:
                    coarsest = max(tiers, key=order.index)
                    totals[name] = summed.bucket(name, coarsest, since)
        return totals

    async def rollup(self) -> int:
        """Fold aged buckets into the next tier and drop expired hour buckets.

        One call catches up however long it was since the last: a minute bucket old enough to
        fold twice ends in its hour bucket.

        Returns:
            How many buckets were folded or dropped.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`MemoryDriver.close`.
        """
        changed = 0
        with self._m.lock:
            now = self._m.now()
            for name in list(self._m.counters):
                buckets = self._m.counters[name]
                for tier in _TIER_PARENT:
                    changed += _fold(buckets, tier, now)
                if not buckets:
                    del self._m.counters[name]
        return changed


def _fold(buckets: dict[_CounterKey, _Counts], tier: CounterTier, now: datetime) -> int:
    """Fold ``tier``'s aged buckets into their parent tier (drop them for ``1h``); answer how many.

    A bucket ages when its whole parent bucket (for ``1h``: the bucket itself) ended more than the
    tier's retention ago.
    """
    parent = _TIER_PARENT[tier]
    cutoff = now - _TIER_KEPT[tier]
    width = _TIER_WIDTH[tier if parent is None else parent]
    aged = [key for key in buckets if key[0] == tier and _floor(key[1], width) + width <= cutoff]
    for key in aged:
        counts = buckets.pop(key)
        if parent is not None:
            into: _CounterKey = (parent, _floor(key[1], width))
            buckets.setdefault(into, _Counts()).add(counts)
    return len(aged)


class MemoryDriver:
    """The in-memory :class:`~jobs_core.driver.JobDriver` with every capability it can carry.

    Attributes:
        name: ``"memory"``.
        capabilities: ``introspect``, ``leases``, ``events``, ``wake``, ``workers``,
            ``counters``, ``scheduler_state``, ``leader``, ``outbox``, ``backfills``,
            ``retention``, and the flags ``priority``, ``debounce``, ``children`` and ``rate``.
        steps: the step store (:class:`MemoryStepStore`).
        introspect: the operator surface (:class:`MemoryIntrospector`).
        leases: the lease store (:class:`MemoryLeaseStore`).
        events: the event bus (:class:`MemoryEventBus`, which wakes waiters).
        wake: the wake source (:class:`MemoryWakeSource`).
        workers: the worker registry (:class:`MemoryWorkerRegistry`).
        counters: the outcome counters (:class:`MemoryCounterStore`).
        scheduler_state: cron watermarks and fires (:class:`MemorySchedulerState`).
        leader: the scheduler's leader lease (:class:`MemoryLeaderLease`).
        outbox: the in-process outbox store (:class:`MemoryOutboxStore`).
        backfills: the backfill ledger (:class:`MemoryBackfillLedger`).
        retention: deletes settled rows (:class:`MemoryRetentionStore`).
        children: child rows by their parent's run (:class:`MemoryChildJobs`).
        rate: fleet-wide rate buckets (:class:`~jobs_core.drivers.memory_rate.MemoryRateStore`).

    Args:
        clock: the clock every time decision reads (due rows, leases, expiry, timestamps);
            :data:`~jobs_core.clock.SYSTEM_CLOCK` when ``None``.

    Every method and every store's method raises ``DriverUnavailableError``
    (``X_DRIVER_UNAVAILABLE``) after :meth:`close`. The driver is safe to share between threads,
    each driving an event loop of its own.
    """

    name: str = "memory"
    capabilities: frozenset[str] = _CAPABILITIES

    def __init__(self, clock: Clock | None = None) -> None:
        """Start empty (the arguments are described in the class docstring)."""
        self._m = _Memory(SYSTEM_CLOCK if clock is None else clock)
        # Typed as the protocol: JobDriver.steps is a settable member, so mypy wants it exact.
        self.steps: StepStore = MemoryStepStore(self._m)
        self.introspect = MemoryIntrospector(self._m)
        self.leases = MemoryLeaseStore(self._m)
        self.events = MemoryEventBus(self._m)
        self.wake = MemoryWakeSource(self._m)
        self.workers = MemoryWorkerRegistry(self._m)
        self.counters = MemoryCounterStore(self._m)
        self.scheduler_state = MemorySchedulerState(self)
        self.leader = MemoryLeaderLease(self._m)
        self.outbox = MemoryOutboxStore(self._m.clock)
        self.backfills = MemoryBackfillLedger(self._m)
        self.retention = MemoryRetentionStore(self._m)
        self.children = MemoryChildJobs(self._m)
        self.rate = MemoryRateStore(self._m)

    async def enqueue(self, req: EnqueueRequest) -> EnqueueResult:
        """Queue one row (the one-element case of :meth:`enqueue_many`).

        Returns:
            The row's ids; ``deduped`` when ``req.id`` names an existing row (live or finished)
            or a live row holds ``(name, tenant_id or '', idempotency_key)``.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` as :meth:`enqueue_many`.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`close`; nothing queued.
        """
        return (await self.enqueue_many([req]))[0]

    async def enqueue_many(self, reqs: Sequence[EnqueueRequest]) -> list[EnqueueResult]:
        """Queue many rows in order, all or none.

        A request whose ``id`` names an existing row (live or finished) answers that row with
        ``deduped=True``; else one whose key a live row holds (an earlier request of this batch
        included) answers that row with ``deduped=True``; else a row is inserted. Its ``run_at``
        is ``req.run_at``, or now plus ``req.delay_ms`` (a negative delay counts as 0); a past
        instant is stored as now, so the row is due at once, behind the rows already due. It is
        ``delayed`` when ``run_at`` is in the future, else ``ready``; wake subscribers hear the
        queue of a ``ready`` row, and of a ``delayed`` one that comes before every other pending
        instant of its queue.

        Returns:
            One result per request, in input order.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID``, inserting nothing, when a
                request has an empty name, queue or idempotency key, ``max_attempts`` below 1, a
                naive ``run_at``, a due instant out of range, or an input that is not JSON (or
                holds a NUL character).
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`close`; nothing queued.
        """
        inputs = [self._checked_input(req) for req in reqs]
        check_run_ids(reqs)
        woken: set[str] = set()
        with self._m.lock:
            now = self._m.now()
            # Every due instant and run id is checked before the first insert so a bad one
            # inserts nothing.
            due = [self._due_at(req, now) for req in reqs]
            self._check_runs(reqs)
            results = [
                self._insert(req, text, run_at, now, woken)
                for req, text, run_at in zip(reqs, inputs, due, strict=True)
            ]
        self._m.notify(woken)
        return results

    def _check_runs(self, reqs: Sequence[EnqueueRequest]) -> None:
        """Refuse a request that would insert a row whose run id another row holds.

        A request answered by the row its id names, or deduped on a live key (an earlier
        request of the batch included), inserts nothing and is never refused.
        """
        m = self._m
        keys: set[tuple[str, str, str]] = set()
        for req in reqs:
            key = (req.name, req.tenant_id or "", req.idempotency_key)
            if req.id in m.rows or key in m.keys or key in keys:
                continue
            keys.add(key)
            holder = m.runs.get(req.run_id)
            if holder is not None:
                raise run_id_taken(req, holder.id)

    @staticmethod
    def _checked_input(req: EnqueueRequest) -> str:
        """Validate the fields a row cannot do without; answer the input's JSON text."""
        check_enqueue_request(req)
        return _encode(req.input, "input")

    @staticmethod
    def _due_at(req: EnqueueRequest, now: datetime) -> datetime:
        """Answer when a new row becomes due: never before ``now``."""
        if req.debounce_ms is not None:
            return _plus_ms(now, req.debounce_ms, "debounce_ms")
        if req.run_at is not None:
            return max(_utc(req.run_at, "run_at"), now)
        return _plus_ms(now, max(req.delay_ms, 0), "delay_ms")

    def _insert(
        self, req: EnqueueRequest, text: str, run_at: datetime, now: datetime, woken: set[str]
    ) -> EnqueueResult:
        """Insert one row unless its id or live key is taken (the caller holds the lock)."""
        m = self._m
        existing = m.rows.get(req.id)
        if existing is None:
            existing = m.keys.get((req.name, req.tenant_id or "", req.idempotency_key))
            if (
                existing is not None
                and req.debounce_ms is not None
                and existing.state in (JobState.READY, JobState.DELAYED)
                and existing.claim == 0
            ):
                self._debounce(existing, req, text, run_at, now, woken)
        if existing is not None:
            return EnqueueResult(existing.id, existing.run_id, deduped=True)
        row = _Row(
            id=req.id,
            run_id=req.run_id,
            name=req.name,
            queue=req.queue,
            input=text,
            idempotency_key=req.idempotency_key,
            tenant_id=req.tenant_id,
            state=JobState.DELAYED if run_at > now else JobState.READY,
            max_attempts=req.max_attempts,
            run_at=run_at,
            created_at=now,
            updated_at=now,
            seq=m.next_seq(),
            traceparent=req.traceparent,
            enqueued_by=req.enqueued_by,
            priority=req.priority,
            debounced=req.debounce_ms is not None,
            parent_run_id=req.parent_run_id,
        )
        m.rows[row.id] = row
        if row.parent_run_id is not None:
            m.children.setdefault(row.parent_run_id, {})[row.id] = row
        m.live[row.id] = row
        m.keys[_live_key(row)] = row
        m.runs[row.run_id] = row
        listing = m.listing
        if not listing or _position(listing[-1]) < _position(row):
            listing.append(row)  # the usual case: ids and the clock only move forward
        else:
            insort(listing, row, key=_position)
        queue = m.queues.get(row.queue)
        if queue is None:
            queue = m.queues[row.queue] = _Queue()
        # A row for later wakes its queue when it comes first: an idle worker sleeping until a
        # later instant must hear of it.
        first = None if row.state is JobState.READY else m.first_pending(queue)
        m.file(row, run_at)
        if row.state is JobState.READY or first is None or run_at < first:
            woken.add(row.queue)
        return EnqueueResult(row.id, row.run_id, deduped=False)

    def _debounce(
        self,
        row: _Row,
        req: EnqueueRequest,
        text: str,
        run_at: datetime,
        now: datetime,
        woken: set[str],
    ) -> None:
        """Give a waiting, never-claimed ``row`` the input of debounced ``req`` (lock held).

        Its run time moves to ``run_at`` (now plus the debounce), capped at its first enqueue
        plus ``req.debounce_max_ms``, never before now; it takes ``req.priority`` too.
        """
        if req.debounce_max_ms is not None:
            cap = _plus_ms(row.created_at, req.debounce_max_ms, "debounce_max_ms")
            run_at = max(min(run_at, cap), now)
        first = self._m.first_pending(self._m.queues[row.queue])
        row.input = text
        row.priority = req.priority
        row.debounced = True
        row.run_at = run_at
        row.state = JobState.DELAYED if run_at > now else JobState.READY
        row.updated_at = now
        self._m.file(row, run_at)
        if row.state is JobState.READY or first is None or run_at < first:
            woken.add(row.queue)

    async def claim(self, req: ClaimRequest) -> list[ClaimedJob]:
        """Lease up to ``req.limit`` claimable rows of ``req.queues`` to ``req.worker_id``.

        Claimable: ``ready``/``delayed``/``suspended`` rows whose ``run_at`` has passed, and
        ``running`` rows whose lease lapsed (that attempt is counted), lowest ``priority`` first,
        then oldest ``(run_at, insertion)``, across the queues; paused queues yield nothing. A
        lapsed row whose counted attempts reach ``max_attempts`` is buried instead: ``dead`` with
        ``last_error`` ``LEASE_LAPSED_FINAL_ATTEMPT``, or ``failed`` if its name is in
        ``req.drop_exhausted``; it frees its key and is reported to ``req.on_exhausted`` (after
        the claim, outside the lock). Each handed-out row is ``running`` until now plus
        ``req.visibility_timeout_ms``, its ``claim`` ordinal one higher.

        Returns:
            The claimed rows; ``attempt`` is the spent attempts plus one.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty queue list, a
                limit below 1, or a visibility timeout out of range.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`close`.
        """
        if not req.queues or req.limit < 1:
            raise DriverRequestInvalidError(
                "a claim needs at least one queue and a limit >= 1",
                queues=list(req.queues),
                limit=req.limit,
            )
        claimed: list[ClaimedJob] = []
        buried: list[BuriedJob] = []
        m = self._m
        with m.lock:
            now = m.now()
            lease_until = _plus_ms(now, req.visibility_timeout_ms, "visibility_timeout_ms")
            queues = [
                m.queues[name]
                for name in dict.fromkeys(req.queues)
                if name in m.queues and name not in m.paused
            ]
            for queue in queues:
                self._promote(queue, now)
            while len(claimed) < req.limit:
                source: _Queue | None = None
                best: _DueEntry | None = None
                for queue in queues:
                    top = self._due_top(queue, now)
                    if top is not None and (best is None or top[:3] < best[:3]):
                        source, best = queue, top
                if source is None or best is None:
                    break
                heapq.heappop(source.due)
                row = best[4]
                if row.state is JobState.RUNNING:
                    row.attempts += 1
                    if row.attempts >= row.max_attempts:
                        dropped = row.name in req.drop_exhausted
                        state = JobState.FAILED if dropped else JobState.DEAD
                        row.last_error = LEASE_LAPSED_FINAL_ATTEMPT
                        row.last_error_code = MaxAttemptsError.code
                        row.last_error_stack = None
                        m.finish(row, state, now)
                        buried.append(
                            BuriedJob(row.id, row.name, row.queue, state, row.parent_run_id)
                        )
                        continue
                if row.debounced and row.claim == 0:
                    # Claimed: a debounced row's key is free for the next burst.
                    key = _live_key(row)
                    if m.keys.get(key) is row:
                        del m.keys[key]
                row.state = JobState.RUNNING
                row.claim += 1
                row.claimed_by = req.worker_id
                row.visible_at = lease_until
                row.updated_at = now
                m.file(row, lease_until)
                claimed.append(self._claimed(row, req.worker_id))
        if req.on_exhausted is not None:
            for job in buried:
                req.on_exhausted(job)
        return claimed

    def _promote(self, queue: _Queue, now: datetime) -> None:
        """Move ``queue``'s entries that became claimable from ``pending`` to ``due``."""
        pending = queue.pending
        while pending and pending[0][0] <= now:
            _, seq, token, row = heapq.heappop(pending)
            if token != row.token:
                continue
            at = row.visible_at if row.state is JobState.RUNNING else row.run_at
            if at is not None and at > now:
                # A heartbeat moved the lease on since this entry was filed.
                heapq.heappush(pending, (at, seq, token, row))
            else:
                heapq.heappush(queue.due, (row.priority, row.run_at, seq, token, row))

    @staticmethod
    def _due_top(queue: _Queue, now: datetime) -> _DueEntry | None:
        """Answer ``queue``'s first valid, claimable ``due`` entry, dropping stale ones."""
        due = queue.due
        while due:
            entry = due[0]
            row = entry[4]
            if entry[3] != row.token:
                heapq.heappop(due)
                continue
            at = row.visible_at if row.state is JobState.RUNNING else row.run_at
            if at is not None and at > now:
                # Renewed since it was promoted (or the clock went back): wait again.
                heapq.heappop(due)
                heapq.heappush(queue.pending, (at, entry[2], entry[3], row))
                continue
            return entry
        return None

    @staticmethod
    def _claimed(row: _Row, worker_id: str) -> ClaimedJob:
        return ClaimedJob(
            id=row.id,
            run_id=row.run_id,
            name=row.name,
            queue=row.queue,
            input=json.loads(row.input),
            attempt=row.attempts + 1,
            max_attempts=row.max_attempts,
            claim=row.claim,
            worker_id=worker_id,
            tenant_id=row.tenant_id,
            idempotency_key=row.idempotency_key,
            traceparent=row.traceparent,
            enqueued_by=row.enqueued_by,
            created_at=row.created_at,
            parent_run_id=row.parent_run_id,
        )

    async def ack(self, job_id: UUID, by: Settle) -> bool:
        """Settle a row ``done`` with ``by.result``; fenced on ``running`` and ``by.fence``.

        The attempt is counted, so the row's spent attempts equal the attempts it used. It frees
        the row's idempotency key and adds ``done`` (and ``by.duration_ms``) to the job's current
        1-minute counter bucket.

        Returns:
            ``True`` when settled; ``False``, changing nothing, when someone else owns the row.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a result that is not JSON.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`close`.
        """
        result = _encode(by.result, "result")
        with self._m.lock:
            now = self._m.now()
            row = self._m.fenced(job_id, by.fence)
            if row is None:
                return False
            row.attempts += 1
            row.result = result
            self._m.finish(row, JobState.DONE, now, by.duration_ms or 0.0)
            return True

    async def nack(self, job_id: UUID, opts: NackOptions) -> bool:
        """Settle a row in ``nack_state(opts)``; fenced like :meth:`ack`.

        The attempt is counted when ``opts.count_attempt``, except for a park (``suspended``),
        which never counts. ``opts.error``, when given, becomes the row's last error. A
        ``ready``/``delayed``/``suspended`` row is due at now plus ``opts.delay_ms`` (wake
        subscribers hear its queue when that is now); ``dead``/``failed`` frees its key. The
        job's current 1-minute counter bucket gains ``dead``, ``failed``, or ``retried`` (a
        counted attempt settled ``ready``/``delayed``).

        Returns:
            ``True`` when settled; ``False``, changing nothing, when someone else owns the row.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a delay out of range.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`close`.
        """
        target = nack_state(opts)
        woken: set[str] = set()
        with self._m.lock:
            now = self._m.now()
            run_at = _plus_ms(now, max(opts.delay_ms, 0), "delay_ms")
            row = self._m.fenced(job_id, opts.fence)
            if row is None:
                return False
            if opts.count_attempt and target is not JobState.SUSPENDED:
                row.attempts += 1
            if opts.error is not None:
                row.last_error = opts.error.message
                row.last_error_code = opts.error.code
                row.last_error_stack = opts.error.stack
            if target is JobState.SUSPENDED and row.wake_pending:
                run_at = now
            row.wake_pending = False
            if target in _QUEUED:
                row.state = target
                row.run_at = run_at
                row.visible_at = None
                row.updated_at = now
                self._m.file(row, run_at)
                if run_at <= now:
                    woken.add(row.queue)
                if opts.count_attempt and target is not JobState.SUSPENDED:
                    self._m.count(row.name, "retried", now)
            else:
                self._m.finish(row, target, now)
        self._m.notify(woken)
        return True

    async def heartbeat(self, job_id: UUID, fence: Fence, visibility_timeout_ms: int) -> bool:
        """Renew a running row's lease to now plus ``visibility_timeout_ms``; fenced like ack.

        Returns:
            ``True`` when renewed; ``False`` when the row was cancelled, settled or re-claimed,
            and the worker should fire the body's cancel signal.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a timeout out of range.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`close`.
        """
        with self._m.lock:
            now = self._m.now()
            until = _plus_ms(now, visibility_timeout_ms, "visibility_timeout_ms")
            row = self._m.fenced(job_id, fence)
            if row is None:
                return False
            # The heaps are not touched: the row's entry is re-filed when it surfaces early.
            row.visible_at = until
            return True

    async def stats(self) -> list[QueueStats]:
        """Answer counts per queue that ever had a row, by effective state, sorted by queue.

        ``ready``/``delayed`` rows count as ready once their ``run_at`` has passed, else as
        delayed; ``oldest_ready_ms`` is now minus the earliest such ready ``run_at`` (0 if none).
        Live rows are scanned; finished rows are counted as they settle.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`close`.
        """
        with self._m.lock:
            now = self._m.now()
            counts: dict[str, dict[JobState, int]] = {
                name: dict(queue.finished) for name, queue in self._m.queues.items()
            }
            oldest: dict[str, datetime] = {}
            for row in self._m.live.values():
                state = row.state
                if state is JobState.READY or state is JobState.DELAYED:
                    if row.run_at <= now:
                        state = JobState.READY
                        if row.queue not in oldest or row.run_at < oldest[row.queue]:
                            oldest[row.queue] = row.run_at
                    else:
                        state = JobState.DELAYED
                per_queue = counts[row.queue]
                per_queue[state] = per_queue.get(state, 0) + 1
        return [
            QueueStats(
                queue=name,
                ready=per_queue.get(JobState.READY, 0),
                delayed=per_queue.get(JobState.DELAYED, 0),
                running=per_queue.get(JobState.RUNNING, 0),
                suspended=per_queue.get(JobState.SUSPENDED, 0),
                done=per_queue.get(JobState.DONE, 0),
                failed=per_queue.get(JobState.FAILED, 0),
                dead=per_queue.get(JobState.DEAD, 0),
                cancelled=per_queue.get(JobState.CANCELLED, 0),
                oldest_ready_ms=(max(0, (now - oldest[name]) // _ONE_MS) if name in oldest else 0),
            )
            for name, per_queue in sorted(counts.items())
        ]

    async def demand(self) -> dict[str, int]:
        """Answer, per queue that ever had a row, running rows under a live lease plus rows due.

        Due rows are ``ready``/``delayed``/``suspended`` rows whose ``run_at`` has passed and
        ``running`` rows whose lease lapsed; a paused queue counts only its live-lease rows.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`close`.
        """
        with self._m.lock:
            now = self._m.now()
            demand = dict.fromkeys(sorted(self._m.queues), 0)
            for row in self._m.live.values():
                if row.state is JobState.RUNNING:
                    leased = row.visible_at is not None and row.visible_at > now
                    due = not leased
                else:
                    leased = False
                    due = row.run_at <= now
                if leased or (due and row.queue not in self._m.paused):
                    demand[row.queue] += 1
            return demand

    def describe(self) -> dict[str, Any]:
        """Answer ``{"name", "capabilities", "not_applicable"}`` (capability lists sorted)."""
        return {
            "name": self.name,
            "capabilities": sorted(self.capabilities),
            "not_applicable": sorted(set(CAPABILITIES) - self.capabilities),
        }

    async def close(self) -> None:
        """Close the driver: later calls raise ``X_DRIVER_UNAVAILABLE``; closing twice is fine.

        Wake subscriptions end; the rows are kept only as long as the object lives.
        """
        with self._m.lock:
            self._m.closed = True
            self._m.subscribers.clear()

    def next_due_at(self) -> datetime | None:
        """Answer when the next claim could take a row, for tests that advance a manual clock.

        It is the earliest ``run_at`` of a live row that is not running, or lease expiry of a
        running row, over queues that are not paused (no claim takes their rows); it may be in
        the past. ``None`` when there is no such row.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`close`.
        """
        with self._m.lock:
            self._m.now()
            instants = [
                row.visible_at if row.state is JobState.RUNNING else row.run_at
                for row in self._m.live.values()
                if row.queue not in self._m.paused
            ]
        return min((at for at in instants if at is not None), default=None)

    def live_count(self) -> int:
        """Answer how many rows are live (``ready``, ``delayed``, ``running``, ``suspended``).

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`close`.
        """
        with self._m.lock:
            self._m.now()
            return len(self._m.live)


def open_memory_driver(url: str, **options: Any) -> MemoryDriver:
    """Open a fresh, empty memory driver (the ``jobs.drivers`` entry point for ``memory``).

    Each call answers a driver of its own: two calls with the same URL share nothing.

    Args:
        url: ``"memory://"`` (no host, path or query).
        **options: ``clock`` (a :class:`~jobs_core.clock.Clock`) and nothing else.

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for another URL, an unknown
            option, or a ``clock`` that is not a Clock.
    """
    parts = urlsplit(url)
    if parts.scheme != "memory" or parts.netloc or parts.path.strip("/") or parts.query:
        raise DriverRequestInvalidError(
            f"the memory driver takes the URL 'memory://', not {url!r}", url=url
        )
    clock = options.pop("clock", None)
    if options:
        raise DriverRequestInvalidError(
            f"the memory driver takes only clock=, not {', '.join(sorted(options))}",
            options=sorted(options),
        )
    if clock is not None and not isinstance(clock, Clock):
        raise DriverRequestInvalidError("clock= must have now() and monotonic()")
    return MemoryDriver(clock)
