"""The worker: claims rows, runs attempts, keeps their leases, drains on SIGTERM.

One loop claims: each pass makes ONE claim over every served queue with a free slot (its limit
the smallest free count, so no queue exceeds its slots, and at most half the slots), starts an
attempt per row, and passes again at once while rows come back. A claim that comes back full (a
backlog) sends the next one before its rows' bodies start, so the database works on it while
they run; at most one claim is in flight, and rows it brings after a stop began are handed back
unrun. A completed body's slot is free while its ack is in flight (unless the job holds a fleet
concurrency slot or has an ``on_settled`` hook), so the next claim overlaps the ack; rows whose
ack is in flight stop lending once they outnumber the slots, so a worker holds at most twice
its slots' rows. A freed slot or a driver wake starts a pass now; an idle pass backs off by
doubling from ``poll_interval`` to ``idle_poll_max``. Where the driver's wake source knows when the
next row falls due (:class:`~jobs_core.driver.TimedWakeSource`), a claim that came back empty asks
it, and the idle wait ends at that instant when it comes before the back-off's: a delayed job, a
retry's back-off or a step's sleep runs on time rather than at the next poll (the source's wake
covers a row enqueued meanwhile for an earlier instant).

One heartbeat task renews every held lease each ``heartbeat`` (a third of the visibility timeout
by default and at most), so a slow body never delays its own renewal (FIELD-FAILURES C05). On
the same cadence the worker registers itself where the driver carries ``workers`` (the row
expires one visibility timeout after the last beat and is removed on a clean stop). With
:class:`~jobs_core.metrics.JobsMetrics` it records each attempt's outcome and duration and
refreshes the queue gauges; with OpenTelemetry installed each attempt runs in a span that is a
child of the enqueuing one.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
import signal
import socket
from collections import Counter
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import Any
from uuid import UUID, uuid4

from jobs_core._current import bind_worker
from jobs_core._durations import Duration, parse_duration
from jobs_core._settle import SettleAbandonedError, SettleRetry
from jobs_core._tracing import attempt_span
from jobs_core.children import publish_settled
from jobs_core.clock import SYSTEM_CLOCK, Clock
from jobs_core.driver import JobDriver, TimedWakeSource, capability, preflight
from jobs_core.errors import (
    ConcurrencyUnenforceableError,
    DrainingError,
    JobCancelledError,
    JobOptionsInvalidError,
    JobsError,
    LeaseLostError,
    RateUnenforceableError,
    SlotLostError,
)
from jobs_core.execute import Attempt, AttemptEnv, Outcome, execute, hand_back
from jobs_core.job import REGISTRY, JobRegistry
from jobs_core.limits import LimitGate, Limits
from jobs_core.logs import log_event
from jobs_core.metrics import JobsMetrics
from jobs_core.types import (
    MAX_WORKER_IN_FLIGHT,
    BuriedJob,
    ClaimedJob,
    ClaimRequest,
    JobState,
    WorkerInfo,
)

_log = logging.getLogger("jobs.worker")

DEFAULT_CONCURRENCY = 64
"""Slots per queue when none are given (``Worker`` and ``jobsctl worker``): sized for I/O-bound
``async`` bodies, which spend their time awaiting the network. Measured on pg (issue 23, quick
peers run, one process): 8 slots drained no-op jobs at 0.78x pgqueuer's defaults, 64 at 2.56x; a
claim takes at most half the slots, so 64 also means claims of 32 rows."""


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """A worker's counters.

    Attributes:
        in_flight: attempts running now (a completed body whose ack is in flight is not).
        max_in_flight: the configured cap on attempts running at once (``Limits(global_=)``),
            or ``None`` when uncapped: what a scaler multiplies by replicas for a fleet ceiling.
        capacity: how many attempts can run at once: the tighter of ``max_in_flight`` and the
            slots in all (the registry row's ``slots``, and ``job_worker_capacity``).
        outcomes: attempts by outcome (``completed``, ``retried``, ...).
        leases_lost: leases lost, by queue.
        peak_in_flight: the most that ran at once so far.
    """

    in_flight: int
    max_in_flight: int | None
    capacity: int
    outcomes: Mapping[str, int]
    leases_lost: Mapping[str, int]
    peak_in_flight: int = 0


@dataclass(slots=True)
class _Held:
    attempt: Attempt
    task: asyncio.Task[None] | None = None
    last_landed: float = 0.0
    settled: bool = False
    # The body completed and only its ack is in flight: the row no longer takes a slot.
    acking: bool = False
    # The row holds a count of the in-process Limits gate (released once, at the earlier of
    # the body's completion and the attempt's end).
    gated: bool = False
    # When the attempt started, and when it last made progress (a step write or a progress
    # report, seen by the heartbeat through ``mark``), on the worker's monotonic clock.
    started: float = 0.0
    progressed: float = 0.0
    mark: tuple[int, int] = (0, 0)
    # The stuck-run warning was logged for this attempt.
    stuck: bool = False
    # The worker cancelled the attempt's task: past an operator cancel's grace (``cancelled``),
    # or by a second stop signal during a drain (``forced``: the row is handed back).
    cancelled: bool = False
    forced: bool = False


def _ms(value: Duration, name: str) -> int:
    try:
        return parse_duration(value, field=name)
    except ValueError as exc:
        raise JobOptionsInvalidError(str(exc), option=name) from None


class Worker:
    """Runs the jobs of some queues from one driver.

    Args:
        driver: where rows come from.
        queues: the queues served (non-empty).
        concurrency: slots per queue: one ``int`` for every queue or ``{queue: slots}``
            (default :data:`DEFAULT_CONCURRENCY`, 64: for I/O-bound async bodies; CPU-bound or
            sync bodies want far fewer, see the README's sizing notes).
        visibility_timeout: the lease each claim buys (``"30s"``).
        heartbeat: how often leases are renewed; default and maximum a third of the visibility
            timeout.
        poll_interval: the first idle back-off (``"250ms"``).
        idle_poll_max: the longest idle back-off (``"2s"``).
        limits: in-process :class:`~jobs_core.limits.Limits`.
        drain_timeout: how long a drain waits for bodies after firing their cancel (``"25s"``).
        registry: the jobs this worker can run (default: every declared job).
        clock: the clock (tests pass a controllable one).
        worker_id: the incarnation id; default ``host:pid:random`` (unique per process start,
            so a restarted pod never adopts an old incarnation's leases).
        build: the app's build or version string shown in the worker registry.
        metrics: where to record outcomes, durations, lost leases and queue gauges.
        metrics_interval: how often the queue gauges are refreshed from the driver (``"15s"``).
        cancel_grace: how long an async body may go on after an operator cancelled its job
            before its task is cancelled (``"5s"``); a sync body cannot be stopped and is logged
            ``jobs.cancel.still-running`` once.
        stuck_after: how long a running attempt may go without step progress (a step write or
            a ``ctx.progress`` report) before ``jobs.attempt.stuck`` is logged once; default 10
            times the visibility timeout.

    Raises:
        JobOptionsInvalidError: ``X_JOB_OPTIONS_INVALID`` for a bad option (named).
    """

    def __init__(
        self,
        driver: JobDriver,
        *,
        queues: Sequence[str] = ("default",),
        concurrency: int | Mapping[str, int] = DEFAULT_CONCURRENCY,
        visibility_timeout: Duration = "30s",
        heartbeat: Duration | None = None,
        poll_interval: Duration = "250ms",
        idle_poll_max: Duration = "2s",
        limits: Limits | None = None,
        drain_timeout: Duration = "25s",
        registry: JobRegistry | None = None,
        clock: Clock | None = None,
        worker_id: str | None = None,
        build: str = "",
        metrics: JobsMetrics | None = None,
        metrics_interval: Duration = "15s",
        cancel_grace: Duration = "5s",
        stuck_after: Duration | None = None,
    ) -> None:
        """Validate the options; nothing runs until :meth:`run`."""
        if (
            isinstance(queues, str)
            or not queues
            or not all(isinstance(q, str) and q for q in queues)
        ):
            raise JobOptionsInvalidError("queues: a non-empty list of queue names", option="queues")
        self.driver = driver
        self.queues = list(dict.fromkeys(queues))
        self.slots = self._slots(concurrency)
        self.visibility_timeout_ms = _ms(visibility_timeout, "visibility_timeout")
        self.heartbeat_ms = (
            self.visibility_timeout_ms // 3 if heartbeat is None else _ms(heartbeat, "heartbeat")
        )
        if self.heartbeat_ms * 3 > self.visibility_timeout_ms or self.heartbeat_ms < 1:
            raise JobOptionsInvalidError(
                f"heartbeat: must be at most a third of visibility_timeout "
                f"({self.visibility_timeout_ms // 3} ms), got {self.heartbeat_ms} ms",
                option="heartbeat",
            )
        self.poll_interval_ms = _ms(poll_interval, "poll_interval")
        self.idle_poll_max_ms = max(_ms(idle_poll_max, "idle_poll_max"), self.poll_interval_ms)
        self.drain_timeout_ms = _ms(drain_timeout, "drain_timeout")
        self.registry = registry or REGISTRY
        self.clock = clock or getattr(driver, "clock", None) or SYSTEM_CLOCK
        self.host = socket.gethostname()
        self.id = worker_id or f"{self.host}:{os.getpid()}:{uuid4().hex[:12]}"
        self.build = build
        self.metrics = metrics
        self.metrics_interval_ms = _ms(metrics_interval, "metrics_interval")
        self.cancel_grace_ms = _ms(cancel_grace, "cancel_grace")
        self.stuck_after_ms = (
            self.visibility_timeout_ms * 10
            if stuck_after is None
            else _ms(stuck_after, "stuck_after")
        )
        self._started_at: datetime | None = None
        self._draining_at: datetime | None = None
        self._abandoned = False
        self.limits = limits
        self._gate = LimitGate(limits, self.clock) if limits is not None else None
        self._held: dict[tuple[UUID, int], _Held] = {}
        # Settle publishes of child jobs the claim buried (awaited nowhere; kept until done).
        self._publishing: set[asyncio.Task[None]] = set()
        # Queue -> rows in ``_held`` whose body runs (``_busy``) or whose ack is in flight
        # (``_acking``), kept in step with it: a claim pass reads them in O(queues).
        self._busy: Counter[str] = Counter()
        self._acking: Counter[str] = Counter()
        self._wake = asyncio.Event()
        self._timers: TimedWakeSource | None = None
        self._stopping = False
        self._claiming = False
        self._drained = asyncio.Event()
        # A drain was asked for; a second stop signal during it (``_forced``) ends it at once.
        self._drain_requested = False
        self._forced = asyncio.Event()
        self._finished = asyncio.Event()
        self._env: AttemptEnv | None = None
        # Every attempt's task runs in a copy of this: the driver and home loop bound once.
        self._attempt_context: contextvars.Context | None = None
        self._peak_in_flight = 0
        self._outcomes: Counter[str] = Counter()
        self._leases_lost: Counter[str] = Counter()

    def _slots(self, concurrency: int | Mapping[str, int]) -> dict[str, int]:
        if isinstance(concurrency, int) and not isinstance(concurrency, bool):
            per = dict.fromkeys(self.queues, concurrency)
        elif isinstance(concurrency, Mapping):
            per = {q: concurrency.get(q, 0) for q in self.queues}
        else:
            raise JobOptionsInvalidError(
                "concurrency: an int or {queue: slots}", option="concurrency"
            )
        bad = [q for q, n in per.items() if not isinstance(n, int) or isinstance(n, bool) or n < 1]
        if bad:
            raise JobOptionsInvalidError(
                f"concurrency: every served queue needs at least 1 slot ({', '.join(bad)})",
                option="concurrency",
            )
        return per

    @property
    def busy(self) -> bool:
        """Whether the worker holds an attempt or has a claim in flight (rows may be running)."""
        return self._claiming or bool(self._held)

    @property
    def max_in_flight(self) -> int | None:
        """The configured cap on attempts running at once (``Limits(global_=)``), or ``None``."""
        return None if self.limits is None else self.limits.global_

    @property
    def capacity(self) -> int:
        """How many attempts can run at once: the slots in all, or the cap when it is tighter."""
        slots = sum(self.slots.values())
        cap = self.max_in_flight
        return slots if cap is None else min(cap, slots)

    def stats(self) -> WorkerStats:
        """Answer the worker's counters now."""
        return WorkerStats(
            in_flight=self._running,
            max_in_flight=self.max_in_flight,
            capacity=self.capacity,
            outcomes=dict(self._outcomes),
            leases_lost=dict(self._leases_lost),
            peak_in_flight=self._peak_in_flight,
        )

    def _check_enforceable(self) -> None:
        served = [h for h in self.registry.all() if h.queue in self.queues]
        checks: tuple[tuple[list[str], str, str, type[JobsError]], ...] = (
            (
                [h.name for h in served if h.concurrency is not None],
                "leases",
                "concurrency but the {driver} driver has no lease store",
                ConcurrencyUnenforceableError,
            ),
            (
                [h.name for h in served if h.rate_limit is not None],
                "rate",
                "a rate but the {driver} driver has no rate store",
                RateUnenforceableError,
            ),
        )
        for names, needed, what, error in checks:
            if names and capability(self.driver, needed) is None:
                raise error(
                    f"jobs {', '.join(names)} declare " + what.format(driver=self.driver.name),
                    jobs=names,
                    driver=self.driver.name,
                )

    def install_signal_handlers(self) -> None:
        """Drain on SIGTERM and SIGINT; a second one during the drain ends it at once.

        Call from the thread running the loop.
        """
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_drain)

    def request_drain(self) -> None:
        """Start a drain from a signal handler or callback; :meth:`run` returns when it ends.

        Called again while the drain runs, it ends the drain at once: the attempts still running
        are cancelled and handed back, their attempt not spent, where the driver answers.
        """
        if self._drain_requested:
            self._forced.set()
        elif not self._stopping:
            self._drain_requested = True
            asyncio.get_running_loop().create_task(self.drain())

    async def run(self) -> None:
        """Claim and run jobs until :meth:`stop` or :meth:`drain` finishes.

        Raises:
            ConcurrencyUnenforceableError: ``X_JOB_CONCURRENCY_UNENFORCEABLE`` when a served job
                declares ``concurrency`` and the driver has no lease store (nothing is claimed).
            RateUnenforceableError: ``X_JOB_RATE_UNENFORCEABLE`` when a served job declares a
                ``rate`` and the driver has no ``rate`` capability (nothing is claimed).
            JobsError: the driver's first-run checks failed (:func:`~jobs_core.driver.preflight`:
                e.g. ``X_SCHEMA_NOT_MIGRATED``, ``X_PERMISSION_DENIED``); nothing is claimed.
        """
        self._check_enforceable()
        await preflight(self.driver)
        loop = asyncio.get_running_loop()
        self._env = AttemptEnv(
            self.driver,
            self.registry,
            self.clock,
            self.visibility_timeout_ms,
            settle_retry=SettleRetry(self._lease_left),
        )
        unsubscribe = None
        wake = capability(self.driver, "wake")
        if wake is not None:
            unsubscribe = await wake.subscribe(self._on_wake)
            self._timers = wake if isinstance(wake, TimedWakeSource) else None
        self._finished.clear()
        self._started_at = self.clock.now()
        await self._register()
        beats = loop.create_task(self._heartbeats())
        gauges = None
        if self.metrics is not None:
            self.metrics.attach(self)
            gauges = loop.create_task(self._refresh_gauges())
        self._attempt_context = contextvars.copy_context()
        self._attempt_context.run(bind_worker, self.driver, loop)
        try:
            await self._claim_loop()
            if self._env.draining:
                await self._drained.wait()
            else:
                tasks = [h.task for h in self._held.values() if h.task is not None]
                if tasks:
                    await asyncio.wait(tasks)
        finally:
            beats.cancel()
            if gauges is not None:
                gauges.cancel()
            if self.metrics is not None:
                self.metrics.detach(self)
            await self._unregister()
            if unsubscribe is not None:
                await unsubscribe()
            self._finished.set()

    def _on_wake(self, queue: str) -> None:
        if queue in self.slots:
            self._wake.set()

    async def _claim_loop(self) -> None:
        idle_ms = self.poll_interval_ms
        drop = frozenset(h.name for h in self.registry.all() if not h.retry.dead_letter)
        # The claim in flight, with its limit.
        pending: tuple[Awaitable[list[ClaimedJob]], int] | None = None
        # The last idle pass heard "a row is due already" after its claim found none.
        due_again = False
        try:
            while not self._stopping:
                self._wake.clear()
                # The queues of a claim sent (not overlapped) in this pass.
                asked: Sequence[str] = ()
                if pending is None:
                    # No claim in flight: this one is awaited here, sent without a task's loop turn.
                    req = self._claim_request(drop)
                    pending = None if req is None else (self.driver.claim(req), req.limit)
                    asked = () if req is None else req.queues
                claimed: list[ClaimedJob] = []
                full = False
                if pending is not None:
                    claimed, full = await self._landed(*pending)
                    pending = None
                if self._stopping:
                    await self._give_back(claimed)
                    break
                held = [self._hold(job) for job in claimed]
                if full:
                    # A full claim means a backlog: the next claim goes out before these bodies run,
                    # so the database works on it while they do (at most one claim is in flight).
                    req = self._claim_request(drop)
                    if req is not None:
                        pending = (
                            asyncio.get_running_loop().create_task(self.driver.claim(req)),
                            req.limit,
                        )
                for one in held:
                    self._begin(one)
                if claimed:
                    self._peak_in_flight = max(self._peak_in_flight, self._running)
                    idle_ms = self.poll_interval_ms
                    due_again = False
                    # One loop turn first: the attempts just started run to their first await (an
                    # idle worker's probe reaches its body's first line) before the next claim is
                    # built and sent.
                    await asyncio.sleep(0)
                    continue
                due_ms = await self._next_due_ms(asked) if asked else None
                if due_ms == 0:
                    # The row fell due between the claim and the question: claim again at once.
                    # Heard twice running (another claimant holds the row locked), the poll
                    # decides, so a row locked elsewhere never turns into a spin of claims.
                    if not due_again:
                        due_again = True
                        continue
                    due_ms = None
                due_again = False
                wait_ms = idle_ms if due_ms is None else min(idle_ms, due_ms)
                try:
                    # A timeout context rather than wait_for: no task per wait, and a wake resumes
                    # this loop one loop turn sooner (part of an idle worker's pickup latency).
                    async with asyncio.timeout(wait_ms / 1000):
                        await self._wake.wait()
                    idle_ms = self.poll_interval_ms
                except TimeoutError:
                    # Only a wait that ran its whole back-off backs off further; one cut short by
                    # a row's due instant claims that row next.
                    if wait_ms == idle_ms:
                        idle_ms = min(idle_ms * 2, self.idle_poll_max_ms)
            if pending is not None:
                claimed, _ = await self._landed(*pending)
                await self._give_back(claimed)
        finally:
            # Cancelled (run() itself was) with a claim in flight: it must not go on alone.
            if pending is not None and isinstance(pending[0], asyncio.Task):
                pending[0].cancel()

    async def _next_due_ms(self, queues: Sequence[str]) -> int | None:
        """Answer the ms until a row of ``queues`` falls due (``0``: one is due already).

        ``None`` when no row waits, the driver cannot tell, or the question failed (logged as
        ``jobs.claim.next-due-failed``): the poll then decides.
        """
        if self._timers is None:
            return None
        try:
            due = await self._timers.next_due_ms(queues)
        except Exception as exc:
            _log.warning(
                "jobs.claim.next-due-failed",
                extra={"event": "jobs.claim.next-due-failed", "error": str(exc)},
            )
            return None
        return None if due is None else max(int(due), 0)

    def _claim_request(self, drop: frozenset[str]) -> ClaimRequest | None:
        """Answer the claim for the free slots (at most half of them); ``None`` when none is free.

        Half, so that when a claim comes back full the next one finds slots to claim while the
        rows just claimed run. Every caller sends the request at once, so a request marks a claim
        in flight (:meth:`_landed` clears the mark).
        """
        busy, acking = self._busy, self._acking
        # A row whose ack is in flight lends its slot (the next claim overlaps the ack) until
        # such rows outnumber the slots: slow acks cannot pile up more than a slot's worth of
        # leases each.
        free = {q: self.slots[q] - busy[q] - max(0, acking[q] - self.slots[q]) for q in self.queues}
        selected = [q for q in self.queues if free[q] > 0]
        if not selected:
            return None
        half = (min(self.slots[q] for q in selected) + 1) // 2
        self._claiming = True
        return ClaimRequest(
            queues=selected,
            limit=min(half, *(free[q] for q in selected)),
            visibility_timeout_ms=self.visibility_timeout_ms,
            worker_id=self.id,
            drop_exhausted=drop,
            on_exhausted=self._buried,
        )

    async def _landed(
        self, claim: Awaitable[list[ClaimedJob]], limit: int
    ) -> tuple[list[ClaimedJob], bool]:
        """Answer a claim's rows (none if it failed) and whether it filled its limit."""
        try:
            claimed = await claim
        except Exception as exc:
            _log.warning(
                "jobs.claim.failed", extra={"event": "jobs.claim.failed", "error": str(exc)}
            )
            claimed = []
        finally:
            self._claiming = False
        return claimed, len(claimed) >= limit

    async def _give_back(self, claimed: list[ClaimedJob]) -> None:
        """Hand back, unrun and due now, rows a claim brought after the worker began stopping."""
        await asyncio.gather(
            *(hand_back(self.driver, job, delay_ms=0) for job in claimed), return_exceptions=True
        )

    def _buried(self, buried: BuriedJob) -> None:
        _log.warning(
            "jobs.lease.lapsed-final",
            extra={
                "event": "jobs.lease.lapsed-final",
                "job": buried.name,
                "job_id": str(buried.id),
                "state": str(buried.state),
            },
        )
        bus = capability(self.driver, "events")
        if buried.parent_run_id is not None and bus is not None:
            # A buried child ended: wake its parent as a settle would (``publish_settled`` logs
            # and swallows its own failures).
            task = asyncio.get_running_loop().create_task(
                publish_settled(bus, buried.parent_run_id, buried.id, str(buried.state))
            )
            self._publishing.add(task)
            task.add_done_callback(self._publishing.discard)

    def _hold(self, job: ClaimedJob) -> _Held:
        """Count a claimed row in its queue's slots (its body starts with :meth:`_begin`)."""
        now = self.clock.monotonic()
        held = _Held(Attempt(job), last_landed=now, started=now, progressed=now)
        held.attempt.body_over = functools.partial(self._acking_now, held)
        key = (job.id, job.claim)
        if key not in self._held:
            self._busy[job.queue] += 1
        self._held[key] = held
        return held

    def _begin(self, held: _Held) -> None:
        """Start a held row's attempt in its own task."""
        context = self._attempt_context
        assert context is not None
        held.task = asyncio.get_running_loop().create_task(
            self._attempt(held), context=context.copy()
        )

    def _acking_now(self, held: _Held) -> None:
        """Lend the slot of a row whose body completed while its ack is in flight."""
        queue = held.attempt.job.queue
        held.acking = True
        self._busy[queue] -= 1
        self._acking[queue] += 1
        # The next row may run in this slot now: the body no longer counts against the limits.
        self._ungate(held)
        self._wake.set()

    def _ungate(self, held: _Held) -> None:
        if held.gated and self._gate is not None:
            held.gated = False
            self._gate.release(held.attempt.job.queue, held.attempt.job.tenant_id)

    @property
    def _running(self) -> int:
        return len(self._held) - sum(self._acking.values())

    async def _attempt(self, held: _Held) -> None:
        job = held.attempt.job
        env = self._env
        assert env is not None
        admitted = self._gate is None or self._gate.admit(job.queue, job.tenant_id)
        held.gated = admitted and self._gate is not None
        outcome: Outcome | str = "lost"
        started = self.clock.monotonic()
        try:
            with attempt_span(job) as traced:
                outcome = (
                    await execute(env, held.attempt)
                    if admitted
                    else await hand_back(self.driver, job)
                )
                traced(outcome)
        except SettleAbandonedError:
            outcome = "lost"  # logged jobs.settle.abandoned; the lease lapses, the row re-runs
        except asyncio.CancelledError:
            if not (held.cancelled or held.forced):
                raise
            # This worker cancelled the task itself; the cancel ends here, not in the loop.
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            outcome = "cancelled" if held.cancelled else await self._forced_back(job)
        except Exception as exc:
            _log.error(
                "jobs.attempt.crashed",
                extra={
                    "event": "jobs.attempt.crashed",
                    "job": job.name,
                    "job_id": str(job.id),
                    "error": str(exc),
                },
            )
            outcome = "crashed"
        finally:
            held.settled = True
            # The lending callback holds the row that holds it: break the cycle, so the row and
            # its attempt are freed now rather than by the cycle collector.
            held.attempt.body_over = None
            self._ungate(held)
            if self._held.pop((job.id, job.claim), None) is not None:
                (self._acking if held.acking else self._busy)[job.queue] -= 1
            self._outcomes[outcome] += 1
            if self.metrics is not None:
                self.metrics.attempt(job.queue, job.name, outcome, self.clock.monotonic() - started)
                if held.attempt.rate_limited is not None:
                    self.metrics.rate_limited(job.queue, job.name, held.attempt.rate_limited)
            self._wake.set()
        if outcome == "cancelled":
            _log.info(
                "jobs.attempt.cancelled",
                extra={
                    "event": "jobs.attempt.cancelled",
                    "job": job.name,
                    "job_id": str(job.id),
                    "attempt": job.attempt,
                    # Whether the body ignored the cancel and its task was cancelled.
                    "task_cancelled": held.cancelled,
                },
            )
        if not _log.isEnabledFor(logging.INFO):
            return
        error = held.attempt.error
        log_event(
            _log,
            logging.INFO,
            "jobs.attempt.settled",
            {
                "job": job.name,
                "job_id": str(job.id),
                "attempt": job.attempt,
                "outcome": outcome,
                # Why it failed, as stored on the row (an error's text, never the input).
                "code": error.code if error else None,
                "error": error.message[:300] if error else None,
            },
        )

    def _lease_left(self, job: ClaimedJob) -> float:
        """Answer how long (s) a held row's lease may still be valid (a settle retries that long).

        The lease was bought or renewed no later than the last renewal landed, so it is surely
        gone one visibility timeout after that; a lost or no longer held row has none left.
        """
        held = self._held.get((job.id, job.claim))
        if held is None or held.attempt.lost:
            return 0.0
        return held.last_landed + self.visibility_timeout_ms / 1000 - self.clock.monotonic()

    async def _forced_back(self, job: ClaimedJob) -> Outcome:
        """Hand back a row whose attempt a forced drain cancelled; answer the outcome."""
        try:
            back = await hand_back(self.driver, job, delay_ms=0)
        except Exception:
            # The lease lapses instead (the attempt is then counted by the next claim).
            return "lost"
        return "interrupted" if back == "deferred" else back

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_ms / 1000)
            held = list(self._held.values())
            if held:
                # return_exceptions: one failing renewal must not end every later heartbeat.
                await asyncio.gather(*(self._beat(h) for h in held), return_exceptions=True)
            self._watch_running(held)
            await self._register()

    def _watch_running(self, held: list[_Held]) -> None:
        """Publish the oldest running attempt's age per queue; warn once for a stuck one.

        An attempt is stuck once ``stuck_after`` passed without a step write or a progress
        report (the run may hold the only slot of its job for hours).
        """
        now = self.clock.monotonic()
        oldest = dict.fromkeys(self.queues, 0.0)
        for one in held:
            if one.settled or one.acking:
                continue
            attempt = one.attempt
            job = attempt.job
            oldest[job.queue] = max(oldest.get(job.queue, 0.0), now - one.started)
            mark = (0 if attempt.runner is None else attempt.runner.writes, attempt.reports)
            if mark != one.mark:
                one.mark, one.progressed = mark, now
            idle = now - one.progressed
            if not one.stuck and idle * 1000 >= self.stuck_after_ms:
                one.stuck = True
                _log.warning(
                    "jobs.attempt.stuck",
                    extra={
                        "event": "jobs.attempt.stuck",
                        "job": job.name,
                        "job_id": str(job.id),
                        "queue": job.queue,
                        "attempt": job.attempt,
                        "running_s": round(now - one.started, 3),
                        "idle_s": round(idle, 3),
                    },
                )
        if self.metrics is not None:
            self.metrics.running_ages(self, oldest)

    async def _register(self) -> None:
        """Insert or refresh this worker's registry row (where the driver keeps one)."""
        registry = capability(self.driver, "workers")
        if registry is None or self._started_at is None:
            return
        info = WorkerInfo(
            id=self.id,
            host=self.host,
            build=self.build,
            started_at=self._started_at,
            queues=tuple(self.queues),
            slots=self.capacity,
            in_flight=tuple(job_id for job_id, _ in islice(self._held, MAX_WORKER_IN_FLIGHT)),
            draining_at=self._draining_at,
        )
        try:
            await registry.beat(info, self.visibility_timeout_ms)
        except Exception as exc:
            # The registry is for operators; a failed beat must not stop the work.
            _log.warning(
                "jobs.worker.register-failed",
                extra={"event": "jobs.worker.register-failed", "error": str(exc)},
            )

    async def _unregister(self) -> None:
        """Delete this worker's registry row on a clean stop.

        After an abandoned drain the driver is closed; the row then expires by itself.
        """
        registry = capability(self.driver, "workers")
        if registry is None or self._abandoned:
            return
        try:
            await registry.remove(self.id)
        except Exception as exc:
            _log.warning(
                "jobs.worker.register-failed",
                extra={"event": "jobs.worker.register-failed", "error": str(exc)},
            )

    async def _refresh_gauges(self) -> None:
        while True:
            await self._refresh_metrics()
            await asyncio.sleep(self.metrics_interval_ms / 1000)

    async def _refresh_metrics(self) -> None:
        """Set the queue gauges from the driver; a draining worker publishes a demand of 0."""
        if self.metrics is None:
            return
        try:
            await self.metrics.refresh(self.driver, draining=self._draining_at is not None)
        except Exception as exc:
            _log.warning(
                "jobs.metrics.refresh-failed",
                extra={"event": "jobs.metrics.refresh-failed", "error": str(exc)},
            )

    async def _beat(self, held: _Held) -> None:
        job = held.attempt.job
        if held.attempt.lost or held.settled or held.attempt.settled:
            return
        try:
            landed = await self.driver.heartbeat(job.id, job.fence, self.visibility_timeout_ms)
            slot = held.attempt.slot
            leases = capability(self.driver, "leases")
            if landed and slot is not None and leases is not None and not held.attempt.slot_lost:
                # False: another holder has the slot (ours expired), so this body must stop.
                kept = await leases.renew(slot)
                if not kept:
                    self._lose_slot(held)
        except Exception as exc:
            _log.warning(
                "jobs.heartbeat.failed",
                extra={"event": "jobs.heartbeat.failed", "job_id": str(job.id), "error": str(exc)},
            )
            if self.clock.monotonic() - held.last_landed >= self.visibility_timeout_ms / 1000:
                self._lose(
                    held, LeaseLostError(f"no renewal of {job.name} landed for a whole lease")
                )
            return
        if landed:
            held.last_landed = self.clock.monotonic()
            return
        if held.settled or held.attempt.settled:
            return
        self._lose(held, await self._why_lost(job))

    async def _why_lost(self, job: ClaimedJob) -> JobsError:
        introspect = capability(self.driver, "introspect")
        if introspect is not None:
            try:
                row = await introspect.get(job.id)
            except Exception:
                row = None
            if row is not None and row.state == JobState.CANCELLED:
                return JobCancelledError(row.last_error or "cancelled by an operator")
        return LeaseLostError(f"the claim on {job.name} is held by someone else")

    def _lose_slot(self, held: _Held) -> None:
        """Stop an attempt whose fleet concurrency slot another holder took.

        The claim is still this worker's: the body's cancel fires with ``X_JOB_SLOT_LOST``, its
        step writes are refused, and when it unwinds the row is handed back, not counted.
        """
        if held.settled or held.attempt.settled or held.attempt.lost:
            return
        attempt = held.attempt
        attempt.slot_lost = True
        slot = attempt.slot
        key = "" if slot is None else slot.key
        attempt.stop(
            SlotLostError(f"another holder took the slot of {key!r}", key=key), abort_writes=True
        )
        job = attempt.job
        _log.error(
            "jobs.slot.lost",
            extra={"event": "jobs.slot.lost", "job": job.name, "job_id": str(job.id), "key": key},
        )

    def _lose(self, held: _Held, reason: JobsError) -> None:
        if held.settled or held.attempt.lost:
            return
        held.attempt.lost = True
        held.attempt.stop(reason, abort_writes=True)
        job = held.attempt.job
        if isinstance(reason, JobCancelledError):
            asyncio.get_running_loop().call_later(
                self.cancel_grace_ms / 1000, self._past_grace, held
            )
        if isinstance(reason, LeaseLostError):
            self._leases_lost[job.queue] += 1
            if self.metrics is not None:
                self.metrics.lease_lost(job.queue)
            _log.error(
                "jobs.lease.lost",
                extra={"event": "jobs.lease.lost", "job": job.name, "job_id": str(job.id)},
            )

    def _past_grace(self, held: _Held) -> None:
        """Cancel the task of a cancelled job's async body that is still running.

        A sync body's thread cannot be stopped: it is logged once and runs on (its step writes
        and its settle are refused, so it cannot change the row).
        """
        task = held.task
        if held.settled or task is None or task.done():
            return
        job = held.attempt.job
        handle = self.registry.get(job.name)
        if handle is not None and not handle.is_async:
            _log.warning(
                "jobs.cancel.still-running",
                extra={
                    "event": "jobs.cancel.still-running",
                    "job": job.name,
                    "job_id": str(job.id),
                    "grace_ms": self.cancel_grace_ms,
                },
            )
            return
        held.cancelled = True
        task.cancel()

    async def stop(self) -> None:
        """Stop claiming and wait until :meth:`run` returned (cancels nothing)."""
        self._stopping = True
        self._wake.set()
        if self._env is not None:
            await self._finished.wait()

    async def drain(self, *, close_driver: bool = True) -> None:
        """Stop claiming, fire every body's cancel with ``X_DRAINING``, wait ``drain_timeout``.

        A body that unwinds because of the drain is interrupted: handed back ``ready`` with its
        attempt not spent. Past the budget the worker logs ``jobs.worker.drain-abandoned``,
        closes the driver (unless ``close_driver`` is ``False``, for a driver the caller goes on
        using) and leaves the leases to lapse.
        """
        if self._stopping:
            return
        self._stopping = True
        self._drain_requested = True
        if self._env is not None:
            self._env.draining = True
        self._draining_at = self.clock.now()
        self._wake.set()
        for held in list(self._held.values()):
            held.attempt.stop(DrainingError("the worker is draining"), abort_writes=False)
        tasks = [h.task for h in self._held.values() if h.task is not None]
        # Operators and autoscalers see the drain at once, not a heartbeat later.
        await self._register()
        await self._refresh_metrics()
        if tasks:
            pending = await self._drain_wait(tasks)
            if pending and self._forced.is_set():
                pending = await self._force(pending)
            if pending:
                self._abandoned = True
                _log.error(
                    "jobs.worker.drain-abandoned",
                    extra={
                        "event": "jobs.worker.drain-abandoned",
                        "abandoned": [str(h.attempt.job.id) for h in self._held.values()],
                    },
                )
                for task in pending:
                    task.cancel()
                if close_driver:
                    await self.driver.close()
        self._drained.set()

    async def _drain_wait(self, tasks: list[asyncio.Task[None]]) -> set[asyncio.Task[Any]]:
        """Wait for ``tasks`` up to ``drain_timeout``, or until a second stop signal."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout_ms / 1000
        pending: set[asyncio.Task[Any]] = set(tasks)
        signalled = loop.create_task(self._forced.wait())
        try:
            while pending and not self._forced.is_set():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                _, pending = await asyncio.wait(
                    {*pending, signalled}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
                pending.discard(signalled)
        finally:
            signalled.cancel()
        return pending

    async def _force(self, pending: set[asyncio.Task[Any]]) -> set[asyncio.Task[Any]]:
        """End a drain at once: cancel the running attempts and hand their rows back.

        Each row is handed back due now with its attempt not spent (a sync body's thread runs
        on, its step writes refused). Answers the tasks that did not end within a heartbeat or
        2 s, whichever is shorter (their leases lapse).
        """
        running = [h for h in self._held.values() if h.task in pending]
        _log.warning(
            "jobs.worker.drain-forced",
            extra={
                "event": "jobs.worker.drain-forced",
                "interrupted": [str(h.attempt.job.id) for h in running],
            },
        )
        for held in running:
            held.forced = True
            held.attempt.stop(DrainingError("the worker was stopped"), abort_writes=True)
            assert held.task is not None
            held.task.cancel()
        # Hand-backs are one round trip each; a driver that does not answer gets 2 s at most.
        _, left = await asyncio.wait(pending, timeout=min(self.heartbeat_ms, 2_000) / 1000)
        return left
