"""Cron state, the leader lease and the worker registry on Redis.

* :class:`RedisSchedulerState` (``scheduler_state``): watermarks in ``<base>wm``, last fires in
  ``<base>fires``, paused tasks in ``<base>ptasks``. A fire is one ``enqueue.lua`` call carrying
  the task and its expected watermark: the script compares the watermark before writing
  anything, inserts the rows with every rule of an enqueue (dedupe on live keys and explicit ids,
  run ids) and moves the watermark, so two schedulers racing for one occurrence fire it once and
  a crash cannot leave the rows without the watermark or the reverse. A separate compare script
  run before the enqueue was rejected: another scheduler could fire between the two calls.
* :class:`RedisLeaderLease` (``leader``): one string key holding the holder, expiring on the
  server's clock (``SET … PX``), renewed by its holder.
* :class:`RedisWorkerRegistry` (``workers``): one hash per worker with a Redis expiry, and a
  sorted set of ids by expiry so a listing reads the live ones without ``SCAN``.
"""

from __future__ import annotations

import builtins
import json
from datetime import datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from jobs_core.driver import (
    check_run_ids,
    check_task_name,
    check_watermark_forward,
    run_id_taken,
)
from jobs_core.errors import DriverRequestInvalidError
from jobs_core.types import EnqueueResult, TaskFire, TaskFireRecord, WorkerInfo
from jobs_redis._codec import from_us, to_us
from jobs_redis._records import pairs

if TYPE_CHECKING:
    from jobs_redis._driver import RedisDriver, _Shared


def _forward(task: str, expected: datetime | None, to: datetime, what: str) -> int:
    """Answer ``to`` in µs, refusing a move that is not past ``expected`` (never backwards).

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive instant or a move
            that is not forward.
    """
    moved = to_us(to, what)
    if expected is not None:
        to_us(expected, "expected")  # refuses a naive instant with the field's name
    check_watermark_forward(task, expected, to, what)
    return moved


def _expected(expected: datetime | None) -> str:
    return "" if expected is None else str(to_us(expected, "expected"))


class RedisSchedulerState:
    """The Redis :class:`~jobs_core.driver.SchedulerState`.

    Args:
        driver: the driver whose rows the fires insert.
    """

    def __init__(self, driver: RedisDriver) -> None:
        """Serve ``driver`` (the arguments are described in the class docstring)."""
        self._driver = driver
        self._s: _Shared = driver._s

    async def _read(self) -> list[Any]:
        keys = self._s.keys
        return list(await self._s.run("scheduler", [keys.base + "wm"], [keys.base, "read"]))

    async def watermarks(self) -> dict[str, datetime]:
        """Answer every task's watermark (UTC) by task name.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        marks, _, _ = await self._read()
        return {task: from_us(us) for task, us in pairs(marks).items()}

    async def fire(self, fire: TaskFire) -> list[EnqueueResult] | None:
        """Enqueue ``fire.requests`` and move the watermark, only if it is ``fire.expected``.

        Returns:
            The enqueue results in request order; ``None``, writing nothing, when the stored
            watermark is not ``fire.expected`` (another scheduler fired first).

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID``, writing nothing, for an empty
                task name, a naive instant, an occurrence not after ``fire.expected``, a
                ``fire.watermark`` before the occurrence, or a request
                :meth:`~jobs_redis.RedisDriver.enqueue` refuses.
            JobRunIdTakenError: ``X_JOB_RUN_ID_TAKEN``, writing nothing, as for an enqueue.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        task = check_task_name(fire.task)
        occurrence = _forward(task, fire.expected, fire.occurrence, "occurrence")
        watermark = occurrence if fire.watermark is None else to_us(fire.watermark, "watermark")
        if watermark < occurrence:
            raise DriverRequestInvalidError(
                f"task {task!r}: the watermark is before the occurrence "
                f"{fire.occurrence.isoformat()} it fires",
                task=task,
            )
        reqs = list(fire.requests)
        rows = [self._driver._row_args(req) for req in reqs]
        check_run_ids(reqs)
        keys = self._s.keys
        reply = await self._s.run(
            "enqueue",
            [keys.seq],
            [
                keys.base,
                len(rows),
                *(v for row in rows for v in row),
                task,
                _expected(fire.expected),
                watermark,
                occurrence,
                fire.cron or "",
                fire.tz or "",
            ],
        )
        if reply and reply[0] == "moved":
            return None
        if reply and reply[0] == "run-id-taken":
            raise run_id_taken(reqs[int(reply[1]) - 1], reply[2])
        return [
            EnqueueResult(UUID(reply[i]), UUID(reply[i + 1]), deduped=bool(int(reply[i + 2])))
            for i in range(0, len(reply), 3)
        ]

    async def advance(self, task: str, expected: datetime | None, to: datetime) -> bool:
        """Move ``task``'s watermark to ``to`` without firing, only if it is ``expected``.

        Returns:
            ``True`` when moved; ``False``, writing nothing, when the stored watermark is not
            ``expected``.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty task name, a
                naive ``to``, or a ``to`` not after ``expected``.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        name = check_task_name(task)
        moved = _forward(name, expected, to, "to")
        keys = self._s.keys
        args = [keys.base, "advance", name, _expected(expected), moved]
        return bool(await self._s.run("scheduler", [keys.base + "wm"], args))

    async def task_fires(self) -> builtins.list[TaskFireRecord]:
        """Answer the last fire of every task that ever fired, sorted by task name.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        _, fires, _ = await self._read()
        out = []
        for task, text in sorted(pairs(fires).items()):
            raw = json.loads(text)
            # Lua's cjson writes an empty array as an empty object.
            ids = raw["job_ids"] or []
            out.append(
                TaskFireRecord(
                    task=task,
                    occurrence=from_us(raw["occurrence"]),
                    watermark=from_us(raw["watermark"]),
                    fired_at=from_us(raw["fired_at"]),
                    job_ids=tuple(UUID(i) for i in ids),
                    cron=raw.get("cron") or None,
                    tz=raw.get("tz") or None,
                )
            )
        return out

    async def paused_tasks(self) -> builtins.list[str]:
        """Answer the paused tasks, sorted.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        _, _, paused = await self._read()
        return sorted(paused)

    async def _toggle(self, mode: str, task: str) -> None:
        keys = self._s.keys
        await self._s.run("scheduler", [keys.base + "wm"], [keys.base, mode, check_task_name(task)])

    async def pause_task(self, task: str) -> None:
        """Stop dispatching ``task`` (its watermark stays where it is; pausing twice is fine).

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty task name.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        await self._toggle("pause", task)

    async def resume_task(self, task: str) -> None:
        """Dispatch ``task`` again; its catch-up policy decides what it missed.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty task name.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        await self._toggle("resume", task)


class RedisLeaderLease:
    """The Redis :class:`~jobs_core.driver.LeaderLease`: ``<base>leader`` with a server expiry.

    Args:
        shared: the driver's connection and keys.
    """

    def __init__(self, shared: _Shared) -> None:
        """Serve ``shared`` (the arguments are described in the class docstring)."""
        self._s = shared

    async def acquire(self, holder: str, ttl_ms: int) -> bool:
        """Take the lease for ``holder`` until the server's now plus ``ttl_ms``, or renew it.

        Returns:
            ``True`` when ``holder`` holds it now (taken free, taken lapsed, or renewed);
            ``False`` when another holder's lease is unexpired.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty holder or
                ``ttl_ms`` below 1.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        if not isinstance(holder, str) or not holder or ttl_ms < 1:
            raise DriverRequestInvalidError(
                "the leader lease needs a non-empty holder and ttl_ms >= 1", ttl_ms=ttl_ms
            )
        key = self._s.keys.base + "leader"
        return bool(await self._s.run("leader", [key], ["acquire", holder, ttl_ms]))

    async def release(self, holder: str) -> None:
        """Free the lease if ``holder`` holds it (nothing happens otherwise).

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        await self._s.run("leader", [self._s.keys.base + "leader"], ["release", holder])

    async def holder(self) -> str | None:
        """Answer the unexpired holder, or ``None`` when the lease is free or lapsed.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        held = await self._s.run("leader", [self._s.keys.base + "leader"], ["holder"])
        return str(held) if held else None


class RedisWorkerRegistry:
    """The Redis :class:`~jobs_core.driver.WorkerRegistry`: rows that expire on the server.

    Args:
        shared: the driver's connection and keys.
    """

    def __init__(self, shared: _Shared) -> None:
        """Serve ``shared`` (the arguments are described in the class docstring)."""
        self._s = shared

    def _key(self) -> str:
        return self._s.keys.base + "workers"

    async def beat(self, info: WorkerInfo, ttl_ms: int) -> None:
        """Insert or replace ``info.id``'s row, expiring ``ttl_ms`` after the server's now.

        The stored row's ``last_heartbeat`` is the server's now and its ``in_flight`` is cut to
        the first 100 ids.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for ``ttl_ms`` below 1.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        if ttl_ms < 1:
            raise DriverRequestInvalidError("a worker row needs ttl_ms >= 1", ttl_ms=ttl_ms)
        row = {
            "host": info.host,
            "build": info.build,
            "started_at": to_us(info.started_at, "started_at"),
            "queues": list(info.queues),
            "slots": info.slots,
            "in_flight": [str(i) for i in info.in_flight[:100]],
            "draining_at": None
            if info.draining_at is None
            else to_us(info.draining_at, "draining_at"),
        }
        args = [self._s.keys.base, "beat", info.id, json.dumps(row), ttl_ms]
        await self._s.run("workers", [self._key()], args)

    async def remove(self, worker_id: str) -> None:
        """Delete a worker's row (nothing happens if it has none).

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        await self._s.run("workers", [self._key()], [self._s.keys.base, "remove", worker_id])

    async def list(self) -> builtins.list[WorkerInfo]:
        """Answer the unexpired rows sorted by id, dropping the expired ones.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        flat = await self._s.run("workers", [self._key()], [self._s.keys.base, "list"])
        out = []
        for i in range(0, len(flat), 3):
            worker_id, text, beat = flat[i : i + 3]
            raw = json.loads(text)
            out.append(
                WorkerInfo(
                    id=worker_id,
                    host=raw["host"],
                    build=raw["build"],
                    started_at=from_us(raw["started_at"]),
                    queues=tuple(raw["queues"]),
                    slots=raw["slots"],
                    in_flight=tuple(UUID(i) for i in raw["in_flight"]),
                    last_heartbeat=from_us(beat),
                    draining_at=None if raw["draining_at"] is None else from_us(raw["draining_at"]),
                )
            )
        return sorted(out, key=lambda w: w.id)
