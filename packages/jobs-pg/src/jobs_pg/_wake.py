"""Wake-ups over LISTEN/NOTIFY: one dedicated connection per driver, proven live by a probe.

The statements that make rows due NOTIFY the queue's name on ``<schema>.wake`` (throttled in
SQL: ``wake()`` notifies a queue once per 250 ms slot, or at once when it is armed). A driver with
wake subscribers holds ONE connection outside the pool that LISTENs there and on a private probe
channel. Each NOTIFY it hears disarms that queue; when a claim then finds nothing, the driver
re-arms it (:meth:`PgWakeSource.rearm`), so the next row made due wakes the idle worker at once
instead of waiting for its poll, while a busy worker (its claims keep finding rows) costs no
NOTIFY beyond one per slot. A probe NOTIFY sent through the pool must come back on it:

* after each dial: back within ``probe_timeout`` → ``jobs.wake.live`` (info), and every known
  queue is woken once, so rows enqueued while nothing listened are claimed now; never back →
  ``jobs.wake.unverified`` (warning, logged once per driver: e.g. a transaction-pooling proxy
  that swallows notifications), then a re-dial after a back-off;
* every ``probe_interval`` while live: not back → ``jobs.wake.lost`` (warning) and a re-dial.
  This catches a half-open connection that no error will ever report (FIELD-FAILURES C09).

A connection error ends the listener the same way. Re-dials back off from 0.25 s to 30 s.
Meanwhile workers poll (the poll is the guarantee; a wake only makes pickup immediate).

Stopping cannot hang. On Python 3.11 a cancel that lands while ``wait_for``'s inner call is
completing is swallowed (and a driver call may swallow one too), so a stop that cancelled the
listener once and awaited it without bound hung about once in 10-20 stops landing a few ms after
the start. A stop now sets the listener's stop flag (checked at every turn of its loops), cancels
it again every :data:`STOP_CANCEL_EVERY_S` up to :data:`STOP_CANCELS` times, and then leaves it,
logged ``jobs.wake.stop-abandoned``; the listener's own waits use ``asyncio.timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from uuid import uuid4

import psycopg
from psycopg import sql

from jobs_core.errors import DriverUnavailableError
from jobs_pg._db import Db, application_name, read_write

_log = logging.getLogger("jobs.wake")

BACKOFF_MIN_S = 0.25
BACKOFF_MAX_S = 30.0
REARM_RETRY_MIN_S = 0.005
REARM_RETRY_MAX_S = 1.0
STOP_CANCEL_EVERY_S = 0.1
"""How long (s) a stop waits for the listener after each cancel before cancelling it again."""
STOP_CANCELS = 10
"""How many cancels a stop sends before it leaves the listener (a stop takes ~1 s at most)."""
READER_STOP_S = 1.0
"""How long (s) a session that ends waits for its notification reader to finish."""

_Subscriber = tuple[asyncio.AbstractEventLoop, Callable[[str], None]]


class PgWakeSource:
    """The :class:`~jobs_core.driver.WakeSource` over a dedicated LISTEN connection.

    Attributes:
        live: whether the listener's last probe came back.
        backend_pid: the LISTEN connection's server process id (``None`` while not connected).

    Args:
        db: the driver's connection plumbing (probes go through its pool).
        channel: the NOTIFY channel the statements wake (``<schema>.wake``).
        conninfo: where the LISTEN connection dials (the driver's URL unless told otherwise).
        probe_interval: seconds between liveness probes while live.
        probe_timeout: seconds a probe may take to come back.
    """

    def __init__(
        self,
        db: Db,
        channel: str,
        conninfo: str,
        *,
        probe_interval: float = 5.0,
        probe_timeout: float = 2.0,
    ) -> None:
        self._db = db
        self._channel = channel
        self._conninfo = conninfo
        self._probe_channel = f"jobs_probe_{uuid4().hex}"
        self.probe_interval = probe_interval
        self.probe_timeout = probe_timeout
        self._subscribers: dict[int, _Subscriber] = {}
        self._tokens = itertools.count()
        self._task: asyncio.Task[None] | None = None
        # The running listener's stop flag (a new listener gets a new one).
        self._stop_flag: asyncio.Event | None = None
        self._probe_seen: asyncio.Event | None = None
        self._probe_payload = ""
        self._warned_unverified = False
        self._warned_rearm = False
        self._closed = False
        # Queues heard (a NOTIFY, or every queue when the listener became live) since this
        # driver last re-armed them: only these can be disarmed without a NOTIFY still to come.
        self._heard: set[str] = set()
        self._rearming: set[asyncio.Task[None]] = set()
        self.live = False
        self.backend_pid: int | None = None

    async def subscribe(self, callback: Callable[[str], None]) -> Callable[[], Awaitable[None]]:
        """Call ``callback(queue)`` on the calling loop whenever a statement wakes ``queue``.

        The first subscriber starts the listener task (on this loop); the last one to leave
        stops it and closes the LISTEN connection.

        Returns:
            An async function that ends the subscription (safe to call twice).

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after the driver was closed.
        """
        if self._closed:
            raise DriverUnavailableError("the postgresql driver is closed", driver="postgresql")
        loop = asyncio.get_running_loop()
        token = next(self._tokens)
        self._subscribers[token] = (loop, callback)
        if self._task is None or self._task.done():
            self._stop_flag = asyncio.Event()
            self._task = loop.create_task(self._listen(self._stop_flag))

        async def unsubscribe() -> None:
            self._subscribers.pop(token, None)
            if not self._subscribers:
                await self._stop()

        return unsubscribe

    async def close(self) -> None:
        """Stop the listener for good (the driver is closing)."""
        self._closed = True
        self._subscribers.clear()
        await self._stop()

    async def _stop(self) -> None:
        """End the listener: its stop flag, then bounded repeated cancels (no unbounded wait)."""
        for retry in list(self._rearming):
            retry.cancel()
        task, self._task = self._task, None
        flag, self._stop_flag = self._stop_flag, None
        if flag is not None:
            flag.set()
        if task is None:
            return
        for _ in range(STOP_CANCELS):
            if task.done():
                break
            task.cancel()
            await asyncio.wait({task}, timeout=STOP_CANCEL_EVERY_S)
        if not task.done():
            _log.warning(
                "jobs.wake.stop-abandoned",
                extra={"event": "jobs.wake.stop-abandoned", "channel": self._channel},
            )
        elif not task.cancelled():
            task.exception()  # retrieved: a listener that ended by its flag returned cleanly

    async def rearm(self, queues: Sequence[str]) -> bool:
        """Re-arm the wake of ``queues`` after a claim over them found nothing.

        Sends the ``wake_arm`` statement for the queues among ``queues`` this listener heard since
        it last re-armed them (a queue is disarmed only by a NOTIFY, which a live listener hears,
        so an idle poll sends nothing). It waits (20 ms at most) for the statements in flight that
        saw a queue disarmed and sent no NOTIFY, so their rows are visible to the answer. When
        they take longer, a background task tries again with a back-off (up to 1 s apart, while
        the listener is live) and wakes the subscribers if a row is due by then.

        Returns:
            ``True`` when a row of those queues is due now: the caller claims once more rather
            than wait for a NOTIFY that will not come. ``False`` otherwise (nothing due, nothing
            heard, the listener not live, the retry was left to the background task, or the
            statement failed: ``jobs.wake.rearm-failed``, a warning logged once per driver, e.g.
            for a schema not migrated yet). It never raises.
        """
        if not self.live:
            return False
        heard = [queue for queue in queues if queue in self._heard]
        if not heard:
            return False
        self._heard.difference_update(heard)
        due = await self._arm(heard)
        if due is None:
            task = asyncio.get_running_loop().create_task(self._rearm_later(heard))
            self._rearming.add(task)
            task.add_done_callback(self._rearming.discard)
            return False
        return due

    async def next_due_ms(self, queues: Sequence[str]) -> int | None:
        """Answer the milliseconds until a row of ``queues`` becomes claimable, or ``None``.

        A waiting row's run_at or a running row's lease expiry (a lapsed lease makes its row
        claimable), rounded up, on the database's clock; ``0`` when one is due already. Paused
        queues are left out. One ``next_due_ms``
        statement; the enqueue of a row due later that comes first in its queue wakes the
        subscribers, so an idle worker sleeping until a later row asks again.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        due = await self._db.value("next_due_ms", {"queues": list(queues)})
        return None if due is None else max(int(due), 0)

    async def _arm(self, queues: list[str]) -> bool | None:
        """Run ``wake_arm``: whether a row is due, or ``None`` when it could not re-arm now."""
        try:
            due = await self._db.value("wake_arm", {"queues": queues})
        except DriverUnavailableError:
            return None
        except psycopg.Error as exc:
            # A schema not migrated to 0002 yet: claims go on, and the wake is the old one.
            if not self._warned_rearm:
                self._warned_rearm = True
                _log.warning(
                    "jobs.wake.rearm-failed",
                    extra={"event": "jobs.wake.rearm-failed", "error": f"{exc}"},
                )
            return False
        return None if due is None else bool(due)

    async def _rearm_later(self, queues: list[str]) -> None:
        delay = REARM_RETRY_MIN_S
        while self.live and not self._closed:
            await asyncio.sleep(delay)
            due = await self._arm(queues)
            if due is not None:
                if due:
                    for queue in queues:
                        self._dispatch(queue)
                return
            delay = min(delay * 2, REARM_RETRY_MAX_S)

    def _dispatch(self, queue: str) -> None:
        self._heard.add(queue)
        here = asyncio.get_running_loop()
        for token, (loop, callback) in list(self._subscribers.items()):
            try:
                # Another loop must be woken through its self-pipe; this one runs it next turn.
                if loop is here:
                    loop.call_soon(callback, queue)
                else:
                    loop.call_soon_threadsafe(callback, queue)
            except RuntimeError:
                # The subscriber's loop is closed: it can never be told again.
                self._subscribers.pop(token, None)

    async def _listen(self, stop: asyncio.Event) -> None:
        """Dial, LISTEN, prove, relay; on any loss, back off and dial again (until stopped)."""
        backoff = BACKOFF_MIN_S
        while not stop.is_set():
            was_live = False
            try:
                await self._session(stop)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                was_live = self.live
                if was_live:
                    _log.warning(
                        "jobs.wake.lost",
                        extra={"event": "jobs.wake.lost", "error": f"{type(exc).__name__}: {exc}"},
                    )
            finally:
                self.live = False
                self.backend_pid = None
            # A connection that had been live is re-dialled at once; repeated failures back off.
            backoff = BACKOFF_MIN_S if was_live else min(backoff * 2, BACKOFF_MAX_S)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(backoff):
                    await stop.wait()

    async def _session(self, stop: asyncio.Event) -> None:
        """Run one LISTEN connection until it is lost, or until ``stop`` is set (then return).

        Raises:
            Exception: whatever ended it (a connection error, or a probe that never came back).
        """
        # Keepalives let the kernel notice a dead peer too; the probe covers what they miss.
        options: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": 5,
            "keepalives": 1,
            "keepalives_idle": 10,
            "keepalives_interval": 5,
            "keepalives_count": 3,
            **application_name(self._conninfo, f"jobs-pg:{self._db.schema}:wake"),
            # LISTEN is refused on a standby; after a failover the dial finds the new primary.
            **read_write(self._conninfo),
        }
        conn = await psycopg.AsyncConnection.connect(self._conninfo, **options)
        reader: asyncio.Task[None] | None = None
        try:
            if stop.is_set():
                return
            for channel in (self._channel, self._probe_channel):
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            self.backend_pid = conn.info.backend_pid
            self._probe_seen = asyncio.Event()
            reader = asyncio.get_running_loop().create_task(self._read(conn))
            if not await self._probe(reader) and not stop.is_set():
                if not self._warned_unverified:
                    self._warned_unverified = True
                    _log.warning(
                        "jobs.wake.unverified",
                        extra={
                            "event": "jobs.wake.unverified",
                            "channel": self._channel,
                            "detail": "the probe NOTIFY never arrived on the LISTEN connection "
                            "(a transaction-pooling proxy?); workers rely on polling",
                        },
                    )
                raise TimeoutError("the wake probe did not come back")
            if stop.is_set():
                return
            self.live = True
            # Whatever was enqueued while nothing listened is due now: wake every queue once.
            for row in await self._db.rows("queue_names", {}):
                self._dispatch(row[0])
            _log.info(
                "jobs.wake.live",
                extra={
                    "event": "jobs.wake.live",
                    "channel": self._channel,
                    "pid": self.backend_pid,
                },
            )
            while not stop.is_set():
                done, _ = await asyncio.wait({reader}, timeout=self.probe_interval)
                if stop.is_set():
                    return
                if done:
                    reader.result()  # raises the connection error that ended it
                    raise ConnectionError("the LISTEN connection stopped delivering")
                if not await self._probe(reader):
                    raise TimeoutError("a wake probe did not come back: the connection is dead")
        finally:
            if reader is not None:
                reader.cancel()
                await asyncio.wait({reader}, timeout=READER_STOP_S)
            with contextlib.suppress(Exception):
                await conn.close()

    async def _read(self, conn: psycopg.AsyncConnection[Any]) -> None:
        async for note in conn.notifies():
            if note.channel == self._probe_channel:
                if note.payload == self._probe_payload and self._probe_seen is not None:
                    self._probe_seen.set()
            elif note.payload:
                self._dispatch(note.payload)

    async def _probe(self, reader: asyncio.Task[None]) -> bool:
        """Send a probe through the pool; answer whether it came back within the timeout."""
        assert self._probe_seen is not None
        self._probe_seen.clear()
        self._probe_payload = uuid4().hex
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a stop's cancel.
            async with asyncio.timeout(self.probe_timeout):
                await self._db.rows(
                    "wake_probe", {"channel": self._probe_channel, "payload": self._probe_payload}
                )
        except (DriverUnavailableError, TimeoutError):
            return False
        seen = asyncio.ensure_future(self._probe_seen.wait())
        try:
            done, _ = await asyncio.wait(
                {seen, reader}, timeout=self.probe_timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            seen.cancel()
        return seen in done and self._probe_seen.is_set()
