"""The Redis driver: the job protocol over Lua scripts, one per operation, on redis-py asyncio.

Layout (``<base>`` is ``"{<prefix>}:"``; the braces are a Redis Cluster hash tag, so every key of
one prefix lives in one slot and every script runs unchanged on a cluster):

==============================  ==============================================================
key                             holds
==============================  ==============================================================
``<base>j:<id>``                one row (a hash; JSON fields as text, instants in µs)
``<base>s:<run_id>``            a run's steps (records, seqs, statuses, waiting events)
``<base>live``                  live key ``(name, tenant, key)`` -> row id: the dedupe index
``<base>q:<queue>:r``           ready/delayed rows of priority 0 by ``run_at`` (members
                                ``<seq>:<id>``); ``:r<p>`` those of priority ``p``
``<base>q:<queue>:rp``          the non-zero priorities present, scored by themselves
``<base>q:<queue>:s``           suspended rows by ``run_at``
``<base>q:<queue>:l``           running rows by lease expiry
``<base>q:<queue>:f``           finished counts per state
``<base>queues``, ``paused``    queue names ever used; paused queue names
``<base>ev:*``, ``evn:*``,      events, events by name, events by expiry, waiting steps by event
``evx``, ``evw:*``
``<base>ls:*``, ``lx:*``        lease slots in order, and their expiries
``<base>rt:<bucket>``           a rate bucket's newest grant instants (``rate_take.lua``)
``<base>cn``, ``cz:*``,         per-job outcome counters: names, tier indexes, buckets (see
``cb:*``                        :mod:`jobs_redis._counters`)
``<base>wake``                  the pub/sub channel carrying queue names
==============================  ==============================================================

Design notes (the alternatives that were rejected):

* **Three sorted sets per queue instead of one.** A claim must take rows whose ``run_at`` passed
  and running rows whose lease lapsed, oldest ``run_at`` first. One set scored by "claimable at"
  would order a lapsed row by its lease expiry instead of its ``run_at``; one scored by ``run_at``
  would keep leased rows in the way of every claim. Separate sets also make ``stats`` and
  ``demand`` a few ``ZCOUNT`` calls instead of a scan of every row.
* **Members carry a sequence** (``%016d:<id>``), so rows due at the same microsecond keep their
  insertion order, exactly as the memory driver's heaps do.
* **The server's ``TIME`` decides** what is due and what lapsed, never the worker's clock; the
  Python side only validates (a naive ``run_at``, a delay out of range).
* **The operator surface walks a listing index** (``<base>x:<queue>:<state>``) kept by the
  same scripts that change a row's state: see :mod:`jobs_redis._introspect`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Self
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit
from uuid import UUID

import redis.asyncio as aioredis

from jobs_core._durations import Duration, parse_duration
from jobs_core.clock import SYSTEM_CLOCK
from jobs_core.driver import (
    CAPABILITIES,
    EventQuery,
    LeaseRequest,
    PublishRequest,
    StepStore,
    check_enqueue_request,
    check_run_ids,
    run_id_taken,
)
from jobs_core.errors import (
    DriverRequestInvalidError,
)
from jobs_core.ids import new_id
from jobs_core.types import (
    ENQUEUE_CHUNK,
    BuriedJob,
    ClaimedJob,
    ClaimRequest,
    EnqueueRequest,
    EnqueueResult,
    Fence,
    JobState,
    NackOptions,
    QueueStats,
    Settle,
    StepRecord,
    StepWrite,
    StoredEvent,
    nack_state,
)
from jobs_redis._codec import (
    canonical_fields,
    encode,
    from_us,
    live_field,
    opt,
    to_us,
    unopt,
)
from jobs_redis._connection import CLUSTER_SCHEMES, UNAVAILABLE, Client, Connection, prepare
from jobs_redis._counters import RedisCounterStore
from jobs_redis._introspect import RedisChildJobs, RedisIntrospector
from jobs_redis._rate import RedisRateStore
from jobs_redis._records import decode_steps, pairs, record_text
from jobs_redis._retention import RedisRetentionStore
from jobs_redis._scheduler import RedisLeaderLease, RedisSchedulerState, RedisWorkerRegistry
from jobs_redis._scripts import SCRIPTS

_log = logging.getLogger("jobs.redis")

CARRIED: frozenset[str] = frozenset(
    {
        "introspect",
        "leases",
        "events",
        "wake",
        "retention",
        "scheduler_state",
        "leader",
        "workers",
        "priority",
        "debounce",
        "children",
        "rate",
        "counters",
    }
)
"""The optional capabilities this driver declares."""

_NOT_CARRIED: dict[str, str] = {
    "outbox": "the transaction is the database's: stage in Postgres, relay onto Redis",
    "backfills": "no ledger: a backfill is refused with X_NOT_IMPLEMENTED; run backfills on "
    "postgresql://",
}

_QUEUED_STATES = frozenset({JobState.READY, JobState.DELAYED, JobState.SUSPENDED})

PRELOADED_KEPT = 10_000
"""How many claimed runs' steps :attr:`_Shared.preloaded` keeps until their first load (a run
whose load never comes, e.g. a row handed back unrun, is forgotten oldest first)."""

ACK_BATCH = 500
"""The most acks one ``ack.lua`` call settles; more wait for the next call."""


def _checked_ms(ms: int, what: str) -> int:
    """Answer ``ms`` if an instant that far from now exists, like the memory driver's check.

    Only the range is checked here (the process clock is close enough for that); the server's
    ``TIME`` decides every instant that is stored.

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` out of range.
    """
    try:
        SYSTEM_CLOCK.now() + timedelta(milliseconds=ms)
    except OverflowError as exc:
        raise DriverRequestInvalidError(f"{what}={ms} ms is out of range", field=what) from exc
    return ms


class _Keys:
    """Key names of one prefix (all under its hash tag)."""

    def __init__(self, prefix: str) -> None:
        self.base = "{" + prefix + "}:"
        self.seq = self.base + "seq"
        self.queues = self.base + "queues"
        self.paused = self.base + "paused"
        self.events_by_expiry = self.base + "evx"
        self.wake = self.base + "wake"

    def job(self, job_id: UUID | str) -> str:
        return f"{self.base}j:{job_id}"

    def steps(self, run_id: UUID | str) -> str:
        return f"{self.base}s:{run_id}"

    def events(self, name: str) -> str:
        return f"{self.base}evn:{name}"

    def lease(self, key: str) -> list[str]:
        return [f"{self.base}ls:{key}", f"{self.base}lx:{key}"]


class _Shared:
    """What the driver and its stores share: the connection, the key names, preloaded steps.

    Attributes:
        preloaded: the steps of runs this driver claimed (flat ``step_load.lua`` replies, by
            run id), kept until the run's first load or step write, at most
            :data:`PRELOADED_KEPT` of them.
    """

    def __init__(self, conn: Connection, keys: _Keys) -> None:
        self.conn = conn
        self.keys = keys
        self.preloaded: OrderedDict[UUID, list[str]] = OrderedDict()

    def preload(self, run_id: UUID, flat: list[str]) -> None:
        """Keep a claimed run's steps for its first load, forgetting the oldest past the cap."""
        self.preloaded[run_id] = flat
        if len(self.preloaded) > PRELOADED_KEPT:
            self.preloaded.popitem(last=False)

    async def run(self, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        return await self.conn.run(SCRIPTS[script], keys, args)

    async def now(self) -> datetime:
        return from_us(await self.run("time", [self.keys.seq], []))


class RedisStepStore:
    """The Redis driver's :class:`~jobs_core.driver.StepStore`.

    Args:
        shared: the driver's connection and keys.
    """

    def __init__(self, shared: _Shared) -> None:
        """Serve ``shared`` (the arguments are described in the class docstring)."""
        self._s = shared

    async def load(self, run_id: UUID) -> list[StepRecord]:
        """Answer every step of a run in ``seq`` order (empty for a new run).

        The first load of a run this driver just claimed, with no step write through this driver
        since, is answered from the claim's reply without a round trip: only the run's claimant
        writes its steps (``run_inline`` writes runs of its own).

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        flat = self._s.preloaded.pop(run_id, None)
        if flat is None:
            flat = await self._s.run("step_load", [self._s.keys.steps(run_id)], [])
        return decode_steps(pairs(flat)) if flat else []

    async def write(self, write: StepWrite) -> bool:
        """Insert or replace one step record (by ``run_id`` and name), fenced like an ack.

        A write carrying ``job_id`` and ``fence`` lands only while that row is ``running`` under
        the fence and belongs to ``write.run_id``; one carrying neither (``run_inline``) always
        lands. A first insert gets ``seq`` one past the run's highest; a replacement keeps it. A
        fenced ``waiting`` step is indexed under its event, so a publish can wake its run.

        Returns:
            ``True`` when written; ``False``, writing nothing, when the fence does not hold.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a write carrying only one
                of ``job_id`` and ``fence``, an output or match that is not JSON (or holds a NUL
                character), or a naive instant.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        record = write.record
        self._s.preloaded.pop(write.run_id, None)
        if (write.job_id is None) != (write.fence is None):
            raise DriverRequestInvalidError(
                "a step write carries both job_id and fence, or neither (run_inline)",
                job_id=None if write.job_id is None else str(write.job_id),
            )
        output = encode(record.output, "step output")
        match = None if record.match is None else encode(dict(record.match), "step match")
        waits = record.status == "waiting" and record.event is not None
        fence = write.fence
        seq = await self._s.run(
            "step_write",
            [self._s.keys.steps(write.run_id)],
            [
                self._s.keys.base,
                "" if write.job_id is None else str(write.job_id),
                "" if fence is None else fence.worker_id,
                "" if fence is None else str(fence.claim),
                str(write.run_id),
                record.name,
                record_text(record, output, match),
                record.status + ("!" if record.once else ""),
                record.event if waits and record.event else "",
                canonical_fields(match) if waits and match is not None else "",
            ],
        )
        return int(seq) >= 0

    async def now(self) -> datetime:
        """Answer the server's current instant (UTC), from ``TIME``.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        return await self._s.now()


class RedisLeaseStore:
    """The Redis driver's :class:`~jobs_core.driver.LeaseStore`: slots per key with expiry.

    A key's slots are kept in acquisition order with an expiry each; both keys carry a Redis TTL
    as long as their longest slot, so a key whose holders all died is gone by itself.

    Args:
        shared: the driver's connection and keys.
    """

    def __init__(self, shared: _Shared) -> None:
        """Serve ``shared`` (the arguments are described in the class docstring)."""
        self._s = shared

    @staticmethod
    def _check(req: LeaseRequest, *, limit: bool) -> None:
        if (limit and req.limit < 1) or req.ttl_ms < 1:
            raise DriverRequestInvalidError(
                "a lease needs limit >= 1 and ttl_ms >= 1", limit=req.limit, ttl_ms=req.ttl_ms
            )
        _checked_ms(req.ttl_ms, "ttl_ms")

    async def acquire(self, req: LeaseRequest) -> bool:
        """Take a slot of ``req.key`` for ``req.holder`` until now plus ``req.ttl_ms``.

        A holder that already holds a live slot has it renewed (always ``True``).

        Returns:
            ``True`` when held; ``False`` when ``req.limit`` other holders hold live slots.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for ``limit`` or ``ttl_ms``
                below 1.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        self._check(req, limit=True)
        keys = [*self._s.keys.lease(req.key), self._s.keys.seq]
        return bool(await self._s.run("lease_acquire", keys, [req.holder, req.limit, req.ttl_ms]))

    async def renew(self, req: LeaseRequest) -> bool:
        """Extend ``req.holder``'s live slot of ``req.key`` to now plus ``req.ttl_ms``.

        Returns:
            ``True`` when renewed; ``False`` when it holds no live slot (expired or released).

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for ``ttl_ms`` below 1.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        self._check(req, limit=False)
        keys = self._s.keys.lease(req.key)
        return bool(await self._s.run("lease_renew", keys, [req.holder, req.ttl_ms]))

    async def release(self, key: str, holder: str) -> None:
        """Free ``holder``'s slot of ``key`` (nothing happens if it holds none).

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        await self._s.run("lease_release", self._s.keys.lease(key), [holder])

    async def holders(self, key: str) -> list[str]:
        """Answer the holders of ``key``'s live slots, in acquisition order.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        return list(await self._s.run("lease_holders", self._s.keys.lease(key), []))


class RedisEventBus:
    """The Redis driver's :class:`~jobs_core.driver.EventBus`; it wakes waiters.

    A publish stores the event and, in the same script, makes every ``suspended`` run due now
    whose ``waiting`` step for that name has a match the payload satisfies (top-level JSON
    equality), found through an index of waiting steps by event name rather than a scan, and
    publishes their queues on the wake channel. One clock: the server's ``TIME`` stamps publishes
    and waits alike. Expired events never match and stay stored until :meth:`purge_expired`.

    Attributes:
        wakes_waiters: always ``True``.

    Args:
        shared: the driver's connection and keys.
    """

    wakes_waiters: bool = True

    def __init__(self, shared: _Shared) -> None:
        """Serve ``shared`` (the arguments are described in the class docstring)."""
        self._s = shared

    async def publish(self, req: PublishRequest) -> StoredEvent:
        """Store an event, matchable until now plus ``req.ttl_ms``, and wake its waiting runs.

        Returns:
            The stored event (``published_at`` is the server's now).

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a payload that is not JSON
                (or holds a NUL character) or a ``ttl_ms`` out of range.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        payload = encode(req.payload, "payload")
        event_id = new_id()
        published, expires = await self._s.run(
            "event_publish",
            [self._s.keys.seq],
            [
                self._s.keys.base,
                str(event_id),
                req.name,
                payload,
                opt(req.correlation_key),
                _checked_ms(req.ttl_ms, "ttl_ms"),
                canonical_fields(payload),
            ],
        )
        return StoredEvent(
            id=event_id,
            name=req.name,
            payload=json.loads(payload),
            correlation_key=req.correlation_key,
            published_at=from_us(published),
            expires_at=from_us(expires),
        )

    async def find(self, query: EventQuery) -> StoredEvent | None:
        """Answer the earliest unexpired event matching ``query``, or ``None``.

        Earliest is by ``published_at``, then publish order. An event matches when it has the
        name, was published at or after ``query.since``, carries ``query.correlation_key`` when one
        is given, and its payload has every ``query.match`` key with an equal JSON value.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive ``since`` or a
                match that is not JSON.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        match = "" if query.match is None else canonical_fields(encode(dict(query.match), "match"))
        found = await self._s.run(
            "event_find",
            [self._s.keys.events(query.name)],
            [
                self._s.keys.base,
                to_us(query.since, "since"),
                opt(query.correlation_key),
                match,
            ],
        )
        if not found:
            return None
        event_id, payload, correlation, published, expires = found
        return StoredEvent(
            id=UUID(event_id),
            name=query.name,
            payload=json.loads(payload),
            correlation_key=unopt(correlation),
            published_at=from_us(published),
            expires_at=from_us(expires),
        )

    async def now(self) -> datetime:
        """Answer the server's current instant (UTC): the bus's one clock.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        return await self._s.now()

    async def purge_expired(self) -> int:
        """Delete every event whose expiry has passed; answer how many.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        keys = self._s.keys
        return int(await self._s.run("event_purge", [keys.events_by_expiry], [keys.base]))

    async def reset(self) -> int:
        """Delete every event, expired or not (waiting steps are untouched); answer how many.

        The ``ResettableEventBus`` test seam behind ``jobs_core.events.reset_event_bus``.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        keys = self._s.keys
        return int(await self._s.run("event_reset", [keys.events_by_expiry], [keys.base]))


class RedisWakeSource:
    """The Redis driver's :class:`~jobs_core.driver.WakeSource`: pub/sub on ``{prefix}:wake``.

    Enqueues of due rows, nacks due now, publishes that wake a waiting run and resumes publish the
    queue's name. Each subscription holds one pub/sub connection in a task of the subscriber's
    loop and keeps it alive forever (FIELD-FAILURES C12): a lost connection is dialled again with
    a back-off of 50 ms doubling to 2 s, and a silent one is caught by a ``PING`` every
    ``ping_s`` seconds that must be answered within another ``ping_s``. After a reconnect every
    known queue is announced once, so work that arrived during the gap is picked up at once.
    Any other error (an error reply such as an ACL's ``NOPERM``, or a callback that raised) is
    logged as ``jobs.wake.error`` (error, with the traceback; once per distinct error) and retried
    on the same back-off, so the subscription never ends by itself. ``jobs.wake.lost`` (warning)
    and ``jobs.wake.live`` (info) are logged on the transitions, and :attr:`healthy` says whether
    every subscription is listening now.

    Args:
        shared: the driver's connection and keys.
        ping_s: seconds of silence before a ``PING`` proves the connection.
    """

    def __init__(self, shared: _Shared, ping_s: float = 5.0) -> None:
        """Serve ``shared`` (the arguments are described in the class docstring)."""
        self._s = shared
        self._ping_s = ping_s
        self._listening: dict[asyncio.Task[None], bool] = {}

    @property
    def healthy(self) -> bool:
        """Whether every subscription is subscribed now (``True`` with none)."""
        return all(self._listening.values())

    async def subscribe(self, callback: Callable[[str], None]) -> Callable[[], Awaitable[None]]:
        """Call ``callback(queue)`` on the calling task's loop whenever work may be due.

        Returns once the first ``SUBSCRIBE`` is confirmed, so work enqueued after this call is
        heard; or after the first attempt failed (the server is down, or refused it), so a worker
        starting then starts at once and polls while the subscription keeps trying in the
        background.

        Returns:
            An async function that ends the subscription (safe to call twice, and after close).

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`RedisDriver.close`.
        """
        self._s.conn.client()
        first = asyncio.Event()
        task = asyncio.get_running_loop().create_task(self._listen(callback, first))
        self._listening[task] = False
        await first.wait()

        async def unsubscribe() -> None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self._listening.pop(task, None)

        return unsubscribe

    async def next_due_ms(self, queues: Sequence[str]) -> int | None:
        """Answer the milliseconds until a row of ``queues`` becomes claimable, or ``None``.

        A waiting row's run_at or a running row's lease expiry (a lapsed lease makes its row
        claimable), rounded up, on the server's ``TIME``; ``0`` when one is due already. Paused
        queues are left out. One ``next_due``
        script; an enqueue of a row for later that comes first in its queue publishes the queue,
        so an idle worker sleeping until a later row asks again.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        due = await self._s.run("next_due", [self._s.keys.seq], [self._s.keys.base, *queues])
        return None if due is None else int(due)

    def cancel_all(self) -> None:
        """Stop every subscription (on close); each task ends on its own loop."""
        for task in list(self._listening):
            loop = task.get_loop()
            if not loop.is_closed():
                loop.call_soon_threadsafe(task.cancel)
        self._listening.clear()

    async def _listen(self, callback: Callable[[str], None], first: asyncio.Event) -> None:
        me = asyncio.current_task()
        assert me is not None
        loop = asyncio.get_running_loop()
        backoff = 0.05
        gap = False
        # The last error reply logged, so a listener refused on every retry logs it once.
        refused: str | None = None
        while True:
            client = self._s.conn.client()
            pubsub = client.pubsub()
            try:
                async with self._s.conn.deadline():
                    await prepare(client)
                    await pubsub.subscribe(self._s.keys.wake)
                    # redis-py sends SUBSCRIBE without reading its reply: the confirmation, or
                    # the error reply refusing it (raised here), is the first message, and only
                    # a confirmation makes the subscription live.
                    confirmed = None
                    while confirmed is None or confirmed["type"] != "subscribe":
                        confirmed = await pubsub.get_message(timeout=None)
                    # Wakes published while we were away are lost: announce every queue once.
                    missed = await client.smembers(self._s.keys.queues) if gap else set()
                for queue in sorted(missed):
                    callback(str(queue))
                if gap:
                    _log.info("jobs.wake.live", extra={"event": "jobs.wake.live"})
                self._listening[me] = True
                first.set()
                gap, backoff, refused = False, 0.05, None
                heard = loop.time()
                while True:
                    message = await pubsub.get_message(timeout=self._ping_s)
                    if message is not None:
                        heard = loop.time()
                        if message["type"] == "message":
                            callback(str(message["data"]))
                            # Let the woken claim go out before this task reads again.
                            await asyncio.sleep(0)
                    elif loop.time() - heard >= 2 * self._ping_s:
                        raise TimeoutError("the wake connection answered no PING")
                    else:
                        async with self._s.conn.deadline():
                            await pubsub.ping()
            except UNAVAILABLE as exc:
                if not gap:
                    _log.warning(
                        "jobs.wake.lost",
                        extra={"event": "jobs.wake.lost", "error": f"{type(exc).__name__}: {exc}"},
                    )
                self._listening[me] = False
                gap = True
                first.set()
            except Exception as exc:
                # Not an outage (an error reply such as an ACL's NOPERM, or a callback that
                # raised): without this the task ended, the subscriber waited for ``first``
                # forever and no worker was woken again. Logged once per distinct error, then
                # retried on the same back-off as an outage.
                error = f"{type(exc).__name__}: {exc}"
                if error != refused:
                    _log.error(
                        "jobs.wake.error",
                        exc_info=True,
                        extra={"event": "jobs.wake.error", "error": error},
                    )
                    refused = error
                self._listening[me] = False
                gap = True
                first.set()
            finally:
                with contextlib.suppress(*UNAVAILABLE):
                    # redis-py leaves PubSub.aclose unannotated.
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)


def _check_prefix(prefix: str) -> str:
    if not prefix or "{" in prefix or "}" in prefix:
        raise DriverRequestInvalidError(
            f"prefix must be non-empty text without braces (it is the hash tag), not {prefix!r}",
            prefix=prefix,
        )
    return prefix


DEFAULT_URL = "redis://127.0.0.1:6379/0"
"""Where a driver given neither a URL nor a client, with ``REDIS_URL`` unset, connects."""


def _given_client(client: Client) -> str:
    """Check an app's client and answer a URL naming its server (no password) for messages.

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` when the client is not an
            asyncio ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster`` decoding replies
            to text.
    """
    if isinstance(client, aioredis.RedisCluster):
        if not client.get_encoder().decode_responses:
            raise DriverRequestInvalidError(
                "client: build it with decode_responses=True (the driver reads replies as text)",
                option="client",
            )
        seed = client.get_nodes()[0] if client.get_nodes() else None
        where = f"{seed.host}:{seed.port}" if seed is not None else "?"
        return f"redis+cluster://{where}"
    if not isinstance(client, aioredis.Redis):
        raise DriverRequestInvalidError(
            f"client: a redis.asyncio.Redis or RedisCluster, not {type(client).__name__}",
            option="client",
        )
    kwargs = client.connection_pool.connection_kwargs
    if not kwargs.get("decode_responses"):
        raise DriverRequestInvalidError(
            "client: build it with decode_responses=True (the driver reads replies as text)",
            option="client",
        )
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    host, port, db = kwargs.get("host", "localhost"), kwargs.get("port", 6379), kwargs.get("db", 0)
    return f"redis://{host}:{port}/{db}"


def _check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", *CLUSTER_SCHEMES):
        raise DriverRequestInvalidError(
            "the redis driver takes a redis://, rediss://, redis+cluster:// or rediss+cluster:// "
            f"URL, not {url!r}",
            url=url,
        )
    if parts.scheme in CLUSTER_SCHEMES and parts.path.strip("/") not in ("", "0"):
        raise DriverRequestInvalidError(
            f"a Redis Cluster has only database 0, not {parts.path.strip('/')!r}", url=url
        )
    return url


@dataclass(slots=True)
class _PendingAck:
    job_id: UUID
    fence: Fence
    result: str
    duration: str
    answer: asyncio.Future[bool]


class _AckBatcher:
    """Gathers acks into ``ack.lua`` calls: one call in flight per loop, the next gathering.

    redis-py's connections belong to one event loop, so each loop has its own queue and flusher.
    """

    def __init__(self, shared: _Shared, done_ttl_ms: int) -> None:
        self._s = shared
        self._done_ttl_ms = done_ttl_ms
        self._pending: dict[asyncio.AbstractEventLoop, list[_PendingAck]] = {}
        self._flushers: dict[asyncio.AbstractEventLoop, asyncio.Task[None]] = {}

    async def ack(self, job_id: UUID, fence: Fence, result: str, duration_ms: float | None) -> bool:
        loop = asyncio.get_running_loop()
        pending = self._pending.get(loop)
        if pending is None:
            for gone in [other for other in self._pending if other.is_closed()]:
                del self._pending[gone]
                self._flushers.pop(gone, None)
            pending = self._pending[loop] = []
        # A non-finite duration would make HINCRBYFLOAT fail halfway through the batch's script.
        finite = duration_ms is not None and math.isfinite(duration_ms)
        duration = repr(float(duration_ms)) if finite and duration_ms is not None else ""
        mine = _PendingAck(job_id, fence, result, duration, loop.create_future())
        pending.append(mine)
        flusher = self._flushers.get(loop)
        if flusher is None or flusher.done():
            self._flushers[loop] = loop.create_task(self._flush(pending))
        return await mine.answer

    async def _flush(self, pending: list[_PendingAck]) -> None:
        while pending:
            batch = pending[:ACK_BATCH]
            del pending[:ACK_BATCH]
            args: list[Any] = [self._s.keys.base, self._done_ttl_ms, len(batch)]
            for p in batch:
                args += (str(p.job_id), p.fence.worker_id, str(p.fence.claim), p.result, p.duration)
            try:
                landed = await self._s.run("ack", [self._s.keys.seq], args)
            except Exception as exc:
                for p in batch:
                    if not p.answer.done():
                        p.answer.set_exception(exc)
                continue
            except BaseException:
                # The flusher itself was cancelled (its loop is closing): no waiter may hang.
                for p in batch + pending:
                    p.answer.cancel()
                raise
            for p, ok in zip(batch, landed, strict=True):
                if not p.answer.done():
                    p.answer.set_result(bool(ok))


class RedisDriver:
    """The Redis :class:`~jobs_core.driver.JobDriver` (redis-py asyncio, Redis 7+).

    Attributes:
        name: ``"redis"``.
        capabilities: :data:`CARRIED` (see :meth:`describe` for the rest).
        steps: the step store (:class:`RedisStepStore`).
        leases: fleet concurrency slots (:class:`RedisLeaseStore`).
        events: the stored event bus (:class:`RedisEventBus`, which wakes waiters).
        wake: the pub/sub wake source (:class:`RedisWakeSource`).
        retention: deletes settled rows (:class:`~jobs_redis._retention.RedisRetentionStore`).
        children: a run's child jobs (:class:`~jobs_redis._introspect.RedisChildJobs`).
        introspect: the operator surface (:class:`~jobs_redis._introspect.RedisIntrospector`).
        operator: the same object as :attr:`introspect` (its name before ``introspect``).
        scheduler_state: cron watermarks and fires
            (:class:`~jobs_redis._scheduler.RedisSchedulerState`).
        leader: the scheduler's leader lease (:class:`~jobs_redis._scheduler.RedisLeaderLease`).
        workers: the worker registry (:class:`~jobs_redis._scheduler.RedisWorkerRegistry`).
        rate: fleet-wide rate buckets (:class:`~jobs_redis._rate.RedisRateStore`).
        counters: per-job outcome counters in tiers
            (:class:`~jobs_redis._counters.RedisCounterStore`).
        done_ttl_ms: how long a ``done`` row and its steps are kept (0: forever).

    Args:
        url: ``redis://[:password@]host[:port][/db]`` or ``rediss://…`` (TLS), or
            ``redis+cluster://[:password@]host:port`` / ``rediss+cluster://…`` naming one seed
            node of a Redis Cluster (redis-py's ``RedisCluster`` finds the rest); ``None`` reads
            ``REDIS_URL``, else :data:`DEFAULT_URL`.
        client: a ready ``redis.asyncio.Redis`` or ``RedisCluster`` (built with
            ``decode_responses=True``) to use
            instead of a URL: it keeps its own connect, retry and pool behaviour, and a call made
            while its server is away still raises ``X_DRIVER_UNAVAILABLE``. Use it from the event
            loop it belongs to; :meth:`close` leaves it open (the app owns it).
        prefix: every key lives under the hash tag ``{prefix}`` (so one prefix is one Cluster
            slot); two drivers with different prefixes share nothing.
        done_ttl: how long ``done`` rows and their steps are kept (``"7d"``; ``0`` keeps them).
            ``dead``, ``failed`` and ``cancelled`` rows are always kept.
        connect_timeout: the longest a dial may take before the call is refused (``"500ms"``).
        command_timeout: the longest one command may wait for its reply (``"5s"``).

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for another URL scheme, both a
            URL and a client, a client that does not decode replies, a prefix with braces, or a
            bad duration.

    Nothing is dialled until the first call. Every call made while the server cannot be reached
    raises ``DriverUnavailableError`` (``X_DRIVER_UNAVAILABLE``) at once; the next call dials
    again. A server's own error reply (``redis.exceptions.ResponseError``) passes through.
    """

    name: str = "redis"
    capabilities: frozenset[str] = CARRIED

    def __init__(
        self,
        url: str | None = None,
        *,
        client: Client | None = None,
        prefix: str = "jobs",
        done_ttl: Duration = "7d",
        connect_timeout: Duration = "500ms",
        command_timeout: Duration = "5s",
    ) -> None:
        """Keep the settings (the arguments are described in the class docstring)."""
        try:
            self.done_ttl_ms = parse_duration(done_ttl, field="done_ttl", allow_zero=True)
            connect_s = parse_duration(connect_timeout, field="connect_timeout") / 1000
            command_s = parse_duration(command_timeout, field="command_timeout") / 1000
        except ValueError as exc:
            raise DriverRequestInvalidError(str(exc)) from None
        self.prefix = _check_prefix(prefix)
        if client is not None:
            if url is not None:
                raise DriverRequestInvalidError("pass a url or a client, not both", option="client")
            url = _given_client(client)
        else:
            url = _check_url(url or os.environ.get("REDIS_URL") or DEFAULT_URL)
        self._conn = Connection(url, connect_s, command_s, given=client)
        self._keys = _Keys(self.prefix)
        self._s = _Shared(self._conn, self._keys)
        self._acks = _AckBatcher(self._s, self.done_ttl_ms)
        # Typed as the protocol: JobDriver.steps is a settable member, so mypy wants it exact.
        self.steps: StepStore = RedisStepStore(self._s)
        self.leases = RedisLeaseStore(self._s)
        self.events = RedisEventBus(self._s)
        self.wake = RedisWakeSource(self._s)
        self.introspect = RedisIntrospector(self._s)
        # The name the operator calls had before the driver declared ``introspect``.
        self.operator = self.introspect
        self.retention = RedisRetentionStore(self._s)
        self.children = RedisChildJobs(self._s)
        self.scheduler_state = RedisSchedulerState(self)
        self.leader = RedisLeaderLease(self._s)
        self.workers = RedisWorkerRegistry(self._s)
        self.rate = RedisRateStore(self._s)
        self.counters = RedisCounterStore(self._s)

    @classmethod
    async def connect(
        cls,
        url: str | None = None,
        *,
        client: Client | None = None,
        prefix: str = "jobs",
        done_ttl: Duration = "7d",
        connect_timeout: Duration = "500ms",
        command_timeout: Duration = "5s",
    ) -> Self:
        """Open a driver and load every script now, proving the server answers.

        Args:
            url: as for :class:`RedisDriver`.
            client: as for :class:`RedisDriver`.
            prefix: as for :class:`RedisDriver`.
            done_ttl: as for :class:`RedisDriver`.
            connect_timeout: as for :class:`RedisDriver`.
            command_timeout: as for :class:`RedisDriver`.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a bad option.
        """
        driver = cls(
            url,
            client=client,
            prefix=prefix,
            done_ttl=done_ttl,
            connect_timeout=connect_timeout,
            command_timeout=command_timeout,
        )
        await driver._conn.load_all(list(SCRIPTS.values()))
        return driver

    async def enqueue(self, req: EnqueueRequest) -> EnqueueResult:
        """Queue one row (the one-element case of :meth:`enqueue_many`).

        Returns:
            The row's ids; ``deduped`` when ``req.id`` names an existing row (live or finished,
            a ``done`` one only within ``done_ttl``) or a live row holds the key.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` as :meth:`enqueue_many`.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` at once when the server cannot be
                reached; nothing was queued, and the same request (same id) is safe to repeat.
        """
        return (await self.enqueue_many([req]))[0]

    async def enqueue_many(self, reqs: Sequence[EnqueueRequest]) -> list[EnqueueResult]:
        """Queue many rows in order, all or none, in one round trip.

        A request whose ``id`` names an existing row answers that row with ``deduped=True``; else
        one whose key a live row holds (an earlier request of this batch included) answers that
        row with ``deduped=True``; else a row is inserted with ``run_at`` = ``req.run_at`` or the
        server's now plus ``req.delay_ms`` (a negative delay counts as 0; a past instant is stored
        as now). Rows go in chunks of 1,000, one script call each, inside one ``MULTI``/``EXEC``.

        Returns:
            One result per request, in input order.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID``, inserting nothing, when a
                request has an empty name, queue or idempotency key, ``max_attempts`` below 1, a
                naive ``run_at``, a delay out of range, or an input that is not JSON (or holds a
                NUL character).
            JobRunIdTakenError: ``X_JOB_RUN_ID_TAKEN``, inserting nothing of the request's
                chunk of 1,000, for a request that would insert a row under a run id another job
                holds (its row, or its steps within ``done_ttl``), or two requests sharing one.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` at once when the server cannot be
                reached; nothing was queued.
        """
        rows = [self._row_args(req) for req in reqs]
        if not rows:
            return []
        check_run_ids(reqs)
        calls: list[tuple[Sequence[str], Sequence[Any]]] = [
            (
                [self._keys.seq],
                [self._keys.base, len(chunk), *(v for row in chunk for v in row)],
            )
            for chunk in (rows[i : i + ENQUEUE_CHUNK] for i in range(0, len(rows), ENQUEUE_CHUNK))
        ]
        script = SCRIPTS["enqueue"]
        replies = (
            [await self._conn.run(script, *calls[0])]
            if len(calls) == 1
            else await self._conn.run_all(script, calls)
        )
        for offset, reply in zip(range(0, len(reqs), ENQUEUE_CHUNK), replies, strict=True):
            if reply and reply[0] == "run-id-taken":
                raise run_id_taken(reqs[offset + int(reply[1]) - 1], reply[2])
        flat = [v for reply in replies for v in reply]
        return [
            # An inserted row answers the request's own ids: only a deduped one needs parsing.
            EnqueueResult(UUID(flat[i]), UUID(flat[i + 1]), deduped=True)
            if int(flat[i + 2])
            else EnqueueResult(req.id, req.run_id, deduped=False)
            for req, i in zip(reqs, range(0, len(flat), 3), strict=True)
        ]

    @staticmethod
    def _row_args(req: EnqueueRequest) -> list[Any]:
        """Validate one request as the memory driver does; answer its 17 script values."""
        check_enqueue_request(req)
        text = encode(req.input, "input")
        run_at = "" if req.run_at is None else to_us(req.run_at, "run_at")
        delay = 0
        if req.run_at is None and req.delay_ms > 0:
            delay = _checked_ms(req.delay_ms, "delay_ms")
        return [
            str(req.id),
            str(req.run_id),
            req.name,
            req.queue,
            text,
            req.idempotency_key,
            opt(req.tenant_id),
            req.max_attempts,
            run_at,
            delay,
            opt(req.traceparent),
            opt(req.enqueued_by),
            live_field(req.name, req.tenant_id, req.idempotency_key),
            req.priority,
            "" if req.debounce_ms is None else _checked_ms(req.debounce_ms, "debounce_ms"),
            ""
            if req.debounce_max_ms is None
            else _checked_ms(req.debounce_max_ms, "debounce_max_ms"),
            opt(None if req.parent_run_id is None else str(req.parent_run_id)),
        ]

    async def claim(self, req: ClaimRequest) -> list[ClaimedJob]:
        """Lease up to ``req.limit`` claimable rows of ``req.queues`` to ``req.worker_id``.

        Claimable: ``ready``/``delayed``/``suspended`` rows whose ``run_at`` passed and ``running``
        rows whose lease lapsed (that attempt is counted; at most 1,000 lapsed rows per queue are
        looked at per call), oldest ``(run_at, insertion)`` first across the queues, by the
        server's clock; paused queues yield nothing. A lapsed row whose counted attempts reach
        ``max_attempts`` is buried instead: ``dead`` with ``last_error``
        ``LEASE_LAPSED_FINAL_ATTEMPT``, or ``failed`` if its name is in ``req.drop_exhausted``; it
        frees its key, adds to its job's counters and is reported to ``req.on_exhausted``. Each
        handed-out row is ``running`` until the server's now plus ``req.visibility_timeout_ms``,
        its ``claim`` one higher.

        Returns:
            The claimed rows; ``attempt`` is the spent attempts plus one.

        Each claimed run's steps come back in the same reply and answer the run's next
        ``steps.load`` (see :meth:`RedisStepStore.load`).

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty queue list, a
                limit below 1, or a visibility timeout out of range.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` at once when the server cannot be
                reached; nothing was claimed.
        """
        if not req.queues or req.limit < 1:
            raise DriverRequestInvalidError(
                "a claim needs at least one queue and a limit >= 1",
                queues=list(req.queues),
                limit=req.limit,
            )
        queues = list(dict.fromkeys(req.queues))
        drop = sorted(req.drop_exhausted)
        claimed, buried = await self._s.run(
            "claim",
            [self._keys.seq],
            [
                self._keys.base,
                req.limit,
                _checked_ms(req.visibility_timeout_ms, "visibility_timeout_ms"),
                req.worker_id,
                len(queues),
                *queues,
                len(drop),
                *drop,
            ],
        )
        jobs = []
        for i in range(0, len(claimed), 15):
            v = claimed[i : i + 15]
            job = ClaimedJob(
                id=UUID(v[0]),
                run_id=UUID(v[1]),
                name=v[2],
                queue=v[3],
                input=json.loads(v[4]),
                attempt=int(v[5]) + 1,
                max_attempts=int(v[6]),
                claim=int(v[7]),
                worker_id=req.worker_id,
                tenant_id=unopt(v[8]),
                idempotency_key=v[9],
                traceparent=unopt(v[10]),
                enqueued_by=unopt(v[11]),
                created_at=from_us(v[12]),
                parent_run_id=UUID(v[13][1:]) if v[13] else None,
            )
            self._s.preload(job.run_id, v[14])
            jobs.append(job)
        if req.on_exhausted is not None:
            for i in range(0, len(buried), 5):
                job_id, name, queue, state, parent = buried[i : i + 5]
                req.on_exhausted(
                    BuriedJob(
                        UUID(job_id),
                        name,
                        queue,
                        JobState(state),
                        UUID(parent[1:]) if parent else None,
                    )
                )
        return jobs

    def _fence(self, fence: Fence) -> list[Any]:
        return [self._keys.base, fence.worker_id, str(fence.claim)]

    async def ack(self, job_id: UUID, by: Settle) -> bool:
        """Settle a row ``done`` with ``by.result``; fenced on ``running`` and ``by.fence``.

        The attempt is counted, the row's idempotency key freed, and ``done`` (with
        ``by.duration_ms``; a non-finite one counts as 0) added to the job's current 1-minute
        counter bucket in the same script. With ``done_ttl`` the row and its steps expire that
        long after the ack. Acks made on one event loop while an earlier one is in flight go
        together in the next ``ack.lua`` call (up to :data:`ACK_BATCH`), so a busy worker settles
        many rows per round trip and a lone ack waits for nothing.

        Returns:
            ``True`` when settled; ``False``, changing nothing, when someone else owns the row.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a result that is not JSON.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        return await self._acks.ack(job_id, by.fence, encode(by.result, "result"), by.duration_ms)

    async def nack(self, job_id: UUID, opts: NackOptions) -> bool:
        """Settle a row in ``nack_state(opts)``; fenced like :meth:`ack`.

        The attempt is counted when ``opts.count_attempt``, except for a park (``suspended``),
        which never counts. ``opts.error``, when given, becomes the row's last error. A
        ``ready``/``delayed``/``suspended`` row is due at the server's now plus ``opts.delay_ms``
        (its queue is published on the wake channel when that is now); ``dead``/``failed`` frees
        its key and is kept whatever ``done_ttl`` says. The job's current 1-minute counter bucket
        gains ``dead``, ``failed``, or ``retried`` (a counted attempt settled ``ready``/
        ``delayed``), in the same script.

        Returns:
            ``True`` when settled; ``False``, changing nothing, when someone else owns the row.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a delay out of range.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        target = nack_state(opts)
        delay = _checked_ms(max(opts.delay_ms, 0), "delay_ms") if target in _QUEUED_STATES else 0
        error = opts.error
        args = [
            *self._fence(opts.fence),
            target.value,
            "1" if opts.count_attempt else "0",
            delay,
            "0" if error is None else "1",
            "" if error is None else opt(error.message),
            "" if error is None else opt(error.code),
            "" if error is None else opt(error.stack),
        ]
        return bool(await self._s.run("nack", [self._keys.job(job_id)], args))

    async def heartbeat(self, job_id: UUID, fence: Fence, visibility_timeout_ms: int) -> bool:
        """Renew a running row's lease to the server's now plus ``visibility_timeout_ms``.

        Fenced like :meth:`ack`; a lease that lapsed but was not re-claimed yet is renewed too.

        Returns:
            ``True`` when renewed; ``False`` when the row was cancelled, settled or re-claimed,
            and the worker should fire the body's cancel signal.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a timeout out of range.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        vt = _checked_ms(visibility_timeout_ms, "visibility_timeout_ms")
        args = [*self._fence(fence), vt]
        return bool(await self._s.run("heartbeat", [self._keys.job(job_id)], args))

    async def stats(self) -> list[QueueStats]:
        """Answer counts per queue that ever had a row, by effective state, sorted by queue.

        ``ready``/``delayed`` rows count as ready once their ``run_at`` passed (server time),
        else as delayed; ``oldest_ready_ms`` is now minus the earliest such ``run_at`` (0 if
        none). Finished states count settles as they happen, so ``done`` keeps counting rows
        ``done_ttl`` has expired.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        flat = await self._s.run("stats", [self._keys.queues], [self._keys.base])
        out = []
        for i in range(0, len(flat), 11):
            v = flat[i : i + 11]
            oldest = 0 if v[9] == "" else max(0, (int(v[10]) - int(v[9])) // 1000)
            ready, delayed, running, suspended, done, failed, dead, cancelled = map(int, v[1:9])
            out.append(
                QueueStats(
                    v[0],
                    ready=ready,
                    delayed=delayed,
                    running=running,
                    suspended=suspended,
                    done=done,
                    failed=failed,
                    dead=dead,
                    cancelled=cancelled,
                    oldest_ready_ms=oldest,
                )
            )
        return sorted(out, key=lambda s: s.queue)

    async def demand(self) -> dict[str, int]:
        """Answer, per queue that ever had a row, running rows under a live lease plus rows due.

        Due rows are ``ready``/``delayed``/``suspended`` rows whose ``run_at`` passed and
        ``running`` rows whose lease lapsed; a paused queue counts only its live-lease rows.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        flat = await self._s.run("demand", [self._keys.queues], [self._keys.base])
        return {queue: int(n) for queue, n in sorted(pairs(flat).items())}

    def describe(self) -> dict[str, Any]:
        """Answer what this driver is and carries, for ``jobsctl manifest`` and operators.

        Returns:
            ``name``, ``capabilities`` and ``not_applicable`` (sorted, as every driver), plus
            ``url`` (password hidden), ``prefix``, ``done_ttl_ms`` and ``not_carried`` (each
            missing capability and why).
        """
        return {
            "name": self.name,
            "capabilities": sorted(self.capabilities),
            "not_applicable": sorted(set(CAPABILITIES) - self.capabilities),
            "url": self._conn.safe_url(),
            "prefix": self.prefix,
            "done_ttl_ms": self.done_ttl_ms,
            "not_carried": dict(sorted(_NOT_CARRIED.items())),
        }

    async def close(self) -> None:
        """Close the driver: later calls raise ``X_DRIVER_UNAVAILABLE``; closing twice is fine.

        Wake subscriptions end. The rows stay on the server.
        """
        self.wake.cancel_all()
        await self._conn.close()


_OPTIONS = ("prefix", "done_ttl", "connect_timeout", "command_timeout")


def open_redis_driver(url: str, **options: Any) -> RedisDriver:
    """Open a Redis driver (the ``jobs.drivers`` entry point for ``redis`` and ``rediss``).

    ``redis+cluster`` and ``rediss+cluster`` name the same function, for a Redis Cluster.

    Nothing is dialled here (the call is synchronous); the first operation connects, and scripts
    load on first use. The driver's options may ride in the URL's query, so a command line that
    takes only ``--driver URL`` can set them:
    ``redis://127.0.0.1:6379/0?prefix=shop&done_ttl=1d``. Other query parameters go to redis-py.

    Args:
        url: ``redis://…``, ``rediss://…``, ``redis+cluster://…`` or ``rediss+cluster://…``.
        **options: ``prefix``, ``done_ttl``, ``connect_timeout``, ``command_timeout`` (see
            :class:`RedisDriver`) and nothing else.

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for another URL scheme, an unknown
            option, one given both in the URL and as a keyword, or a bad value.
    """
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise DriverRequestInvalidError(
            f"the redis driver takes {', '.join(_OPTIONS)}, not {', '.join(unknown)}",
            options=unknown,
        )
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    in_url: dict[str, Any] = {key: value for key, value in query if key in _OPTIONS}
    twice = sorted(set(in_url) & set(options))
    if twice:
        raise DriverRequestInvalidError(
            f"{', '.join(twice)} given both in the URL and as a keyword", options=twice
        )
    rest = urlencode([(key, value) for key, value in query if key not in _OPTIONS])
    return RedisDriver(urlunsplit(parts._replace(query=rest)), **in_url, **options)
