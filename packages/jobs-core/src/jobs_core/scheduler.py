"""The scheduler: one leader fires cron tasks, and a watermark makes each occurrence fire once.

``Scheduler(driver)`` runs rounds (:meth:`Scheduler.tick_once`; :meth:`Scheduler.run` loops them).

Leadership
    A lease with an expiry (:class:`~jobs_core.driver.LeaderLease`), never a session advisory
    lock: over a pooler such a lock can outlive or miss its session (FIELD-FAILURES C18). The
    holder id is one process incarnation, ``host:pid:random``, never the host name alone, so two
    processes on one machine, or a restarted one, are never the same holder. The leader renews
    every third of the TTL; a standby tries to take the lease at the same cadence, so it takes
    over within TTL plus a third of it after the leader's last renewal. A renewal that fails (an
    error, or ``False``) ends leadership at once: the scheduler fires nothing until an acquire
    lands again, and then reloads its watermarks. It also stops firing once a whole TTL has
    passed since the last acquire that landed was sent, even if it was frozen and never saw the
    renewal fail.

Exactly once
    Leadership is an optimisation, not the guarantee. Every fire is one
    ``state.fire(TaskFire(...))`` that enqueues the occurrence's jobs AND moves the watermark,
    compare-and-set on the watermark this scheduler read. Two schedulers that both believe they
    lead (or run with no lease at all) cannot both land a fire of one occurrence: the loser gets
    ``None`` and reloads the watermarks. The jobs' ids are derived from the occurrence too
    (:mod:`jobs_core.task`), so even a repeated fire would insert nothing.

Idle rounds read no store
    Watermarks are read once when leadership is (re)gained and then kept in memory; from them
    the leader knows each task's next due instant. A round with nothing due makes no store call
    (the lease renewal keeps its own cadence), and :meth:`Scheduler.run` sleeps until the next
    due instant, the next renewal, or ``tick``, whichever is first. Rejected: reading the
    watermarks every round, which costs one query per second per scheduler for work that
    happens once an hour.

Catch-up (occurrences missed while no scheduler ran, or while the task was paused)
    * ``skip`` fires only the latest missed occurrence, found by bisection
      (:meth:`~jobs_core.cron.CronSchedule.latest_at_or_before`, O(log gap) evaluations).
    * ``run-once`` fires the earliest missed occurrence and moves the watermark to the latest
      missed one **in the same write** (:attr:`~jobs_core.types.TaskFire.watermark`). Rejected:
      a fire followed by ``advance``, where a crash between the two fires the backlog again.
    * ``run-all`` fires each missed occurrence in order, one write each, at most
      ``max_catch_up`` per round; the rest follow one ``tick`` later.

    An on-time fire costs one cron evaluation (is the due occurrence the only one missed?); the
    bisection runs only after an outage.

A task never fired
    A task with no stored watermark starts from "now": when leadership is gained its watermark
    is set to the leader's current instant (``advance`` from ``None``), so its first fire is its
    next occurrence and a later failover catches up from there. Occurrences before a task was
    first scheduled are not caught up.

Pauses
    A paused task is skipped at due time and its watermark is NOT moved, so on resume its
    catch-up policy decides what the pause missed (``skip``: the latest occurrence only). The
    paused set is read once per round in which some task is due (never in idle rounds); a task
    found paused is looked at again a third of the lease TTL later.

Time: the store's clock
    Due decisions read the store's time, not the scheduler process's: at each lease renewal
    (every third of the TTL, with or without a lease) the scheduler asks the driver's step store
    for its ``now()`` (the database's ``now()`` on pg, Redis ``TIME``), measures its own clock's
    skew against it (half the round trip counted on each side) and schedules on its own clock
    minus that skew until the next measure. A scheduler whose host clock ran 3 minutes ahead
    used to fire each cron occurrence ~172 s early; now it fires on time. The skew is logged
    (``jobs.scheduler.clock-skew``, a warning from 1 s on, whenever it moved 100 ms since the
    last log) and exported as ``scheduler_clock_skew_seconds`` (positive: the scheduler's host
    runs ahead). A measure that fails keeps the last skew. Rejected: trusting NTP, which was
    what let the field's 3 minutes through.

Counters
    The leader folds the outcome counters once a minute (``rollup_interval``): the driver's
    ``counters`` store :meth:`~jobs_core.driver.CounterStore.rollup`. Without it minute
    buckets pile up and a job's history is cut at the newest 4,176 buckets (~2.9 days). A
    rollup that fails is logged ``jobs.scheduler.rollup-failed`` and tried again a minute later.

A fire that fails (its entries do not validate, the store errs) is logged
``jobs.task.fire-failed`` and retried a third of the lease TTL later; the watermark stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal
from uuid import uuid4

from jobs_core._durations import Duration, parse_duration
from jobs_core.clock import SYSTEM_CLOCK, Clock
from jobs_core.driver import (
    CounterStore,
    JobDriver,
    LeaderLease,
    SchedulerState,
    capability,
    require_capability,
)
from jobs_core.errors import JobOptionsInvalidError
from jobs_core.metrics import JobsMetrics
from jobs_core.task import TASK_REGISTRY, TaskHandle
from jobs_core.types import TaskFire, TaskFireRecord

__all__ = ["Scheduler"]

_log = logging.getLogger("jobs.scheduler")

_Outcome = Literal["fired", "lost", "failed"]


@dataclass(slots=True, eq=False)
class _Track:
    """What the leader keeps in memory for one task between rounds."""

    task: TaskHandle
    watermark: datetime
    due: datetime
    """The first occurrence after ``watermark``."""
    hold_until: datetime | None = None
    """Not looked at before this instant (found paused, or its fire failed)."""

    def ready(self, now: datetime) -> bool:
        return self.due <= now and (self.hold_until is None or self.hold_until <= now)


def _ms(value: Duration, name: str) -> int:
    try:
        return parse_duration(value, field=name)
    except ValueError as exc:
        raise JobOptionsInvalidError(str(exc), option=name) from None


class Scheduler:
    """Fires cron tasks from one leader, each occurrence once, with catch-up after downtime.

    Args:
        driver: the driver the jobs go to; its ``scheduler_state`` and ``leader`` capabilities
            are used unless ``state`` / ``leader`` are given.
        state: the :class:`~jobs_core.driver.SchedulerState` (watermarks, fires, pauses).
        leader: the :class:`~jobs_core.driver.LeaderLease`; ``None`` takes the driver's (when it
            has none, every scheduler fires and the watermark's compare-and-set alone keeps each
            occurrence single); ``False`` runs without election on purpose.
        tasks: the tasks to fire (default: every task declared in
            :data:`~jobs_core.task.TASK_REGISTRY` when the scheduler is built).
        clock: the clock due decisions read (default the real one).
        tick: the longest sleep between rounds (``"1s"``); also the pace of a ``run-all``
            backlog.
        leader_ttl: the lease's time to live (``"30s"``); renewed every third of it.
        holder_id: the incarnation id; default ``host:pid:random``. Give one only if it is
            unique per process start (never just the host name: FIELD-FAILURES C18).
        rollup_interval: how often the leader folds the driver's counters (``"1m"``).
        metrics: where ``scheduler_clock_skew_seconds`` is set after each measure.

    Raises:
        JobOptionsInvalidError: ``X_JOB_OPTIONS_INVALID`` for a bad ``tick``, ``leader_ttl``,
            ``holder_id``, ``rollup_interval`` or ``tasks`` (two different tasks with one name),
            naming the option.
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` when no ``state`` is given and the
            driver has no ``scheduler_state``.
    """

    def __init__(
        self,
        driver: JobDriver,
        *,
        state: SchedulerState | None = None,
        leader: LeaderLease | Literal[False] | None = None,
        tasks: Iterable[TaskHandle] | None = None,
        clock: Clock | None = None,
        tick: Duration = "1s",
        leader_ttl: Duration = "30s",
        holder_id: str | None = None,
        rollup_interval: Duration = "1m",
        metrics: JobsMetrics | None = None,
    ) -> None:
        """Validate the options; nothing runs until :meth:`run` or :meth:`tick_once`."""
        self.driver = driver
        self.tick_ms = _ms(tick, "tick")
        self.rollup_interval_ms = _ms(rollup_interval, "rollup_interval")
        self.metrics = metrics
        self.leader_ttl_ms = _ms(leader_ttl, "leader_ttl")
        if self.leader_ttl_ms < 3:
            raise JobOptionsInvalidError(
                "leader_ttl: must be at least 3 ms (it is renewed every third of it)",
                option="leader_ttl",
            )
        self.renew_ms = self.leader_ttl_ms // 3
        if holder_id is not None and (not isinstance(holder_id, str) or not holder_id.strip()):
            raise JobOptionsInvalidError("holder_id: must be non-empty text", option="holder_id")
        self.holder_id = holder_id or f"{socket.gethostname()}:{os.getpid()}:{uuid4().hex[:12]}"
        self.tasks: dict[str, TaskHandle] = {}
        for handle in TASK_REGISTRY.all() if tasks is None else tasks:
            known = self.tasks.setdefault(handle.name, handle)
            if known is not handle:
                raise JobOptionsInvalidError(
                    f"tasks: two different tasks are named {handle.name!r}", option="tasks"
                )
        self.state: SchedulerState = (
            state if state is not None else require_capability(driver, "scheduler_state")
        )
        self.leader: LeaderLease | None = (
            capability(driver, "leader") if leader is None else leader or None
        )
        self.clock = clock or SYSTEM_CLOCK
        self.counters: CounterStore | None = capability(driver, "counters")
        # The scheduler's clock minus the store's, from the last measure (seconds).
        self._skew_s = 0.0
        self._skew_logged: float | None = None
        self._next_measure = -math.inf
        self._next_rollup = -math.inf
        self._leading = False
        self._tracks: dict[str, _Track] | None = None
        self._next_acquire = -math.inf
        self._lease_until = -math.inf
        self._stopping = False
        self._wake = asyncio.Event()
        self._finished = asyncio.Event()
        self._running = False

    @property
    def is_leader(self) -> bool:
        """Whether this scheduler leads now (always, when it runs without a lease)."""
        return self._leading and self._lease_valid()

    @property
    def clock_skew_ms(self) -> float:
        """The scheduler's clock minus the store's, in ms, at the last measure (0 before one)."""
        return self._skew_s * 1000

    def now(self) -> datetime:
        """Answer the store's current instant as this scheduler knows it (its clock, unskewed)."""
        return self.clock.now() - timedelta(seconds=self._skew_s)

    async def tick_once(self) -> list[TaskFireRecord]:
        """Run one round: keep (or seek) the lease; as leader, fire what is due.

        Returns:
            The fires this round landed, in order (``fired_at`` on the store's clock as the
            scheduler measured it, see :meth:`now`).

        Raises:
            JobsError: reading the watermarks or the paused tasks failed (the driver's error,
                e.g. ``X_DRIVER_UNAVAILABLE``); the cache is dropped and the next round reloads.
        """
        await self._measure_skew()
        await self._keep_lease()
        if not self.is_leader:
            return []
        await self._rollup()
        now = self.now()
        try:
            tracks = self._tracks if self._tracks is not None else await self._load(now)
            if tracks is None:
                return []
            due = [track for track in tracks.values() if track.ready(now)]
            if not due:
                return []
            paused = set(await self.state.paused_tasks())
        except BaseException:
            self._tracks = None
            raise
        fired: list[TaskFireRecord] = []
        for track in due:
            if not self.is_leader:
                break
            if track.task.name in paused:
                track.hold_until = now + timedelta(milliseconds=self.renew_ms)
                _log.info(
                    "jobs.task.paused-skipped",
                    extra={
                        "event": "jobs.task.paused-skipped",
                        "task": track.task.name,
                        "due": track.due.isoformat(),
                    },
                )
                continue
            track.hold_until = None
            if await self._fire_due(track, now, fired) == "lost":
                # Another scheduler moved a watermark: every cached one is suspect.
                self._tracks = None
                break
        return fired

    async def run(self) -> None:
        """Run rounds until :meth:`stop`; release the lease on the way out.

        A round that raises is logged ``jobs.scheduler.round-failed`` and the next one starts
        after ``tick`` with the watermarks reloaded.
        """
        self._running = True
        self._finished.clear()
        try:
            while not self._stopping:
                try:
                    await self.tick_once()
                except Exception as exc:
                    _log.error(
                        "jobs.scheduler.round-failed",
                        extra={
                            "event": "jobs.scheduler.round-failed",
                            "holder": self.holder_id,
                            "error": str(exc),
                            "code": getattr(exc, "code", None),
                        },
                    )
                self._wake.clear()
                if self._stopping:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._sleep_seconds())
        finally:
            await self._release()
            self._running = False
            self._finished.set()

    def request_stop(self) -> None:
        """Ask :meth:`run` to return after the round in flight (safe from a signal handler)."""
        self._stopping = True
        self._wake.set()

    async def stop(self) -> None:
        """Stop :meth:`run` and wait until it returned (the lease is released).

        A stopped scheduler does not run again: build a new one.
        """
        self.request_stop()
        if self._running:
            await self._finished.wait()

    # -- the store's clock and the counters -----------------------------------------------------

    async def _measure_skew(self) -> None:
        """Measure the scheduler's clock against the store's, every third of the lease TTL."""
        sent = self.clock.monotonic()
        if sent < self._next_measure:
            return
        self._next_measure = sent + self.renew_ms / 1000
        before = self.clock.now()
        try:
            store = await self.driver.steps.now()
        except Exception as exc:
            _log.warning(
                "jobs.scheduler.clock-failed",
                extra={
                    "event": "jobs.scheduler.clock-failed",
                    "holder": self.holder_id,
                    "error": str(exc),
                },
            )
            return
        after = self.clock.now()
        self._skew_s = ((before + (after - before) / 2) - store).total_seconds()
        if self.metrics is not None:
            self.metrics.clock_skew.set(self._skew_s)
        if self._skew_logged is not None and abs(self._skew_s - self._skew_logged) < 0.1:
            return
        self._skew_logged = self._skew_s
        _log.log(
            logging.WARNING if abs(self._skew_s) >= 1 else logging.INFO,
            "jobs.scheduler.clock-skew",
            extra={
                "event": "jobs.scheduler.clock-skew",
                "holder": self.holder_id,
                "skew_ms": round(self._skew_s * 1000, 1),
            },
        )

    async def _rollup(self) -> None:
        """As leader, fold the driver's counters once per ``rollup_interval``."""
        if self.counters is None:
            return
        sent = self.clock.monotonic()
        if sent < self._next_rollup:
            return
        self._next_rollup = sent + self.rollup_interval_ms / 1000
        try:
            await self.counters.rollup()
        except Exception as exc:
            _log.warning(
                "jobs.scheduler.rollup-failed",
                extra={
                    "event": "jobs.scheduler.rollup-failed",
                    "holder": self.holder_id,
                    "error": str(exc),
                    "code": getattr(exc, "code", None),
                },
            )

    # -- leadership ---------------------------------------------------------------------------

    def _lease_valid(self) -> bool:
        return self.leader is None or self.clock.monotonic() < self._lease_until

    async def _keep_lease(self) -> None:
        if self.leader is None:
            self._leading = True
            return
        sent = self.clock.monotonic()
        if sent < self._next_acquire:
            return
        self._next_acquire = sent + self.renew_ms / 1000
        try:
            held = await self.leader.acquire(self.holder_id, self.leader_ttl_ms)
        except Exception as exc:
            _log.warning(
                "jobs.scheduler.lease-failed",
                extra={
                    "event": "jobs.scheduler.lease-failed",
                    "holder": self.holder_id,
                    "error": str(exc),
                },
            )
            self._demote("the lease renewal failed")
            return
        if not held:
            self._demote("another scheduler holds the lease")
            return
        # Measured from before the call: the store's expiry is at least this late.
        self._lease_until = sent + self.leader_ttl_ms / 1000
        if not self._leading:
            self._leading = True
            self._tracks = None
            _log.info(
                "jobs.scheduler.leader-acquired",
                extra={"event": "jobs.scheduler.leader-acquired", "holder": self.holder_id},
            )

    def _demote(self, reason: str) -> None:
        self._lease_until = -math.inf
        if not self._leading:
            return
        self._leading = False
        self._tracks = None
        _log.warning(
            "jobs.scheduler.leader-lost",
            extra={"event": "jobs.scheduler.leader-lost", "holder": self.holder_id, "why": reason},
        )

    async def _release(self) -> None:
        if self.leader is None or not self._leading:
            return
        self._leading = False
        self._tracks = None
        self._lease_until = -math.inf
        try:
            await self.leader.release(self.holder_id)
            _log.info(
                "jobs.scheduler.leader-released",
                extra={"event": "jobs.scheduler.leader-released", "holder": self.holder_id},
            )
        except Exception as exc:
            # The lease lapses on its own after its TTL; a standby takes over then.
            _log.warning(
                "jobs.scheduler.lease-failed",
                extra={
                    "event": "jobs.scheduler.lease-failed",
                    "holder": self.holder_id,
                    "error": str(exc),
                },
            )

    # -- firing -------------------------------------------------------------------------------

    async def _load(self, now: datetime) -> dict[str, _Track] | None:
        """Read the watermarks into the cache; start tasks never fired from ``now``.

        Answers ``None`` (cache still empty) when another scheduler started a task first.
        """
        stored = await self.state.watermarks()
        tracks: dict[str, _Track] = {}
        for name, handle in self.tasks.items():
            watermark = stored.get(name)
            if watermark is None:
                if not await self.state.advance(name, None, now):
                    return None
                watermark = now
            tracks[name] = _Track(handle, watermark, handle.schedule.next_after(watermark))
        self._tracks = tracks
        return tracks

    async def _fire_due(
        self, track: _Track, now: datetime, fired: list[TaskFireRecord]
    ) -> _Outcome:
        handle = track.task
        schedule = handle.schedule
        if handle.catch_up == "run-all":
            for occurrence in schedule.occurrences_between(
                track.watermark, now, handle.max_catch_up
            ):
                outcome = await self._fire(track, occurrence, occurrence, None, now, fired)
                if outcome != "fired":
                    return outcome
            return "fired"
        first = track.due
        # The usual, on-time case: ``first`` is the only occurrence missed, which one evaluation
        # shows (and it is the next due instant too). Bisection runs only after an outage.
        after_first = schedule.next_after(first)
        if after_first > now:
            latest = first
        else:
            found = schedule.latest_at_or_before(now, first)
            assert found is not None  # after_first is in (first, now]
            latest = found
        occurrence = latest if handle.catch_up == "skip" else first
        next_due = after_first if latest == first else None
        return await self._fire(track, occurrence, latest, next_due, now, fired)

    async def _fire(
        self,
        track: _Track,
        occurrence: datetime,
        watermark: datetime,
        next_due: datetime | None,
        now: datetime,
        fired: list[TaskFireRecord],
    ) -> _Outcome:
        name = track.task.name
        try:
            # Built (and validated) before the store is asked: a bad entry writes nothing.
            requests = tuple(track.task.requests(occurrence))
            results = await self.state.fire(
                TaskFire(
                    task=name,
                    occurrence=occurrence,
                    expected=track.watermark,
                    requests=requests,
                    watermark=None if watermark == occurrence else watermark,
                    cron=track.task.cron,
                    tz=track.task.tz,
                )
            )
        except Exception as exc:
            track.hold_until = now + timedelta(milliseconds=self.renew_ms)
            _log.error(
                "jobs.task.fire-failed",
                extra={
                    "event": "jobs.task.fire-failed",
                    "task": name,
                    "occurrence": occurrence.isoformat(),
                    "error": str(exc),
                    "code": getattr(exc, "code", None),
                },
            )
            return "failed"
        if results is None:
            _log.info(
                "jobs.task.fire-lost",
                extra={
                    "event": "jobs.task.fire-lost",
                    "task": name,
                    "occurrence": occurrence.isoformat(),
                },
            )
            return "lost"
        track.watermark = watermark
        track.due = next_due or track.task.schedule.next_after(watermark)
        record = TaskFireRecord(
            task=name,
            occurrence=occurrence,
            watermark=watermark,
            fired_at=self.now(),
            job_ids=tuple(result.id for result in results),
        )
        fired.append(record)
        _log.info(
            "jobs.task.fired",
            extra={
                "event": "jobs.task.fired",
                "task": name,
                "occurrence": occurrence.isoformat(),
                "watermark": watermark.isoformat(),
                "jobs": len(results),
                "deduped": sum(result.deduped for result in results),
            },
        )
        return "fired"

    def _sleep_seconds(self) -> float:
        """Answer how long :meth:`run` may sleep: until a task is due, a lease call, or tick."""
        waits = [self.tick_ms / 1000, self._next_measure - self.clock.monotonic()]
        if self.leader is not None:
            waits.append(self._next_acquire - self.clock.monotonic())
        if self.is_leader and self.counters is not None:
            waits.append(self._next_rollup - self.clock.monotonic())
        if self.is_leader and self._tracks:
            now = self.now()
            for track in self._tracks.values():
                at = max(track.due, track.hold_until or track.due)
                # A task already due waits for the next round (a run-all backlog, a hold).
                if at > now:
                    waits.append((at - now).total_seconds())
        return max(0.0, min(waits))
