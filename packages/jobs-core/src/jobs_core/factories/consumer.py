"""``consumer()``: a long-running reader of a queue, a change stream or a vendor's cursor.

A consumer is three declarations: the job ``<name>`` (one running body per key, idempotency key
``consumer:<name>:<key>``), the job ``<name>.arm`` (enqueues the job once per ``keys()``) and the
cron task ``<name>.supervisor`` (enqueues ``<name>.arm`` every ``rearm``, UTC). A live key's
re-arm is deduped onto the running body; a key whose body ended (the source ran dry, it failed
for good, a deploy drained it) starts again from its saved cursor.

The body loads the key's cursor, opens the app's source at it and hands ``handle`` batches of up
to ``batch`` items (or what came within ``max_wait`` of a batch's first item). Each batch runs in
one transaction of the cursor store: ``handle(items, tx)`` writes its effects on ``tx`` and
answers the next cursor, which is saved on ``tx`` before the commit, so the cursor and the
effects commit together or not at all. A crash before the commit re-delivers the batch (at
least once per item: ``handle`` writes idempotently), and the saved cursor never runs ahead of
the effects. The body writes no steps (a run that lives for weeks would pile up one per batch):
the cursor store is its checkpoint.

The drain is honoured between batches: a batch being handled commits, then the body stops
(interrupted, not counted); items read ahead are read again from the cursor by the next body. A
consumer has no ``timeout`` (it runs until drained). Its run may not enqueue its own consumer
(``X_CONSUMER_SELF_ENQUEUE``): that would dedupe onto the running row and arm nothing.

The batch boundaries are announced to :mod:`jobs_core.faults` like steps (``before`` the
handler, ``returned`` after it and before the commit, ``persisted`` after the commit; the step
is ``batch:<n>``, counted from 0 per attempt), so crash tests can kill a worker at each.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol, cast, runtime_checkable

from pydantic import BaseModel, ConfigDict

from jobs_core import faults
from jobs_core._durations import Duration, duration_problem, parse_duration
from jobs_core.context import CancelSignal, JobContext
from jobs_core.errors import ConsumerInvalidError, ConsumerSelfEnqueueError
from jobs_core.factories._shared import adopt, arity, call, is_positive_int
from jobs_core.job import JobHandle, JobRegistry, declaration_site, job
from jobs_core.retry import Retry
from jobs_core.serialization import to_json_form
from jobs_core.steps import Step
from jobs_core.task import TaskHandle, TaskRegistry, task
from jobs_core.types import ENQUEUE_CHUNK, EnqueueRequest, JSONValue

__all__ = [
    "DEFAULT_CONSUMER_BATCH",
    "DEFAULT_REARM",
    "ConsumerCursor",
    "ConsumerJob",
    "ConsumerKey",
    "CursorWrite",
    "MemoryCursorStore",
    "consumer",
]

DEFAULT_CONSUMER_BATCH = 100
"""Items per ``handle`` call when ``batch`` is not given."""

MAX_CONSUMER_BATCH = 10_000
"""The largest batch."""

DEFAULT_REARM = "1m"
"""How often the supervisor re-arms the keys when ``rearm`` is not given."""

DEFAULT_MAX_WAIT = "1s"
"""How long a batch waits for more items after its first one."""

DEFAULT_RETRY = Retry(attempts=5, delay="1s", max_delay="1m")
"""A failed batch retries the body (from the saved cursor); a key that fails for good is started
again by the next re-arm."""

_RUNNING: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "jobs_consumer_running", default=None
)
"""The consumer whose body runs in this context (the self-enqueue guard reads it)."""


@dataclass(frozen=True, slots=True)
class CursorWrite:
    """One cursor to save (``ConsumerCursor.save``).

    Attributes:
        consumer: the consumer's name.
        key: the key it reads.
        cursor: the cursor ``handle`` answered (JSON).
    """

    consumer: str
    key: str
    cursor: JSONValue


@runtime_checkable
class ConsumerCursor(Protocol):
    """Where a consumer keeps each key's cursor, in the transaction of the batch's effects.

    :class:`MemoryCursorStore` is the in-process one; ``jobs_pg.PgCursorStore`` keeps cursors in
    PostgreSQL and hands ``handle`` the batch's connection inside its transaction.
    """

    async def load(self, consumer: str, key: str) -> JSONValue:
        """Answer the saved cursor of ``(consumer, key)``, or ``None`` for none yet."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[Any]:
        """Open the transaction one batch runs in; it commits on a clean exit, else rolls back."""
        ...

    async def save(self, write: CursorWrite, tx: Any) -> None:
        """Save a cursor on ``tx`` (it lands when ``tx`` commits)."""
        ...


class _MemoryTransaction:
    """The cursors one memory transaction saved, kept until it commits."""

    def __init__(self) -> None:
        self.saved: dict[tuple[str, str], JSONValue] = {}


class MemoryCursorStore:
    """Cursors in this process's memory (tests, the demo, ``memory://``).

    A transaction is the cursors saved inside it, applied at its clean exit; the app's own
    effects in ``handle`` are its business (the memory store has no database to join).
    """

    def __init__(self) -> None:
        """Start with no cursor saved."""
        self._cursors: dict[tuple[str, str], JSONValue] = {}

    async def load(self, consumer: str, key: str) -> JSONValue:
        """Answer the saved cursor of ``(consumer, key)``, or ``None``."""
        return self._cursors.get((consumer, key))

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[_MemoryTransaction]:
        """Open a transaction; its saved cursors apply only if the block exits cleanly."""
        tx = _MemoryTransaction()
        yield tx
        self._cursors.update(tx.saved)

    async def save(self, write: CursorWrite, tx: Any) -> None:
        """Stage a cursor on ``tx`` (a transaction of this store)."""
        tx.saved[(write.consumer, write.key)] = to_json_form(write.cursor)


class ConsumerKey(BaseModel):
    """The input of a consumer's job: which key it reads."""

    model_config = ConfigDict(extra="forbid")

    key: str


class ArmRun(BaseModel):
    """The input of ``<name>.arm``: none (``{}``)."""

    model_config = ConfigDict(extra="forbid")


_END = object()
_TIMEOUT = object()


class _Reader:
    """Reads the app's source ahead into a bounded queue, so batches can wait with a deadline.

    Waiting on the source itself with a deadline would cancel its ``__anext__`` and close an
    async generator for good; the reader task keeps reading instead, at most one batch ahead.
    """

    def __init__(self, source: Any, size: int) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=size)
        self._source = source
        self._task: asyncio.Task[None] | None = None
        self.ended = False

    async def __aenter__(self) -> _Reader:
        self._task = asyncio.get_running_loop().create_task(self._pump())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with suppress(asyncio.CancelledError):
            await self._task
        closer = getattr(self._source, "aclose", None)
        if callable(closer):
            await closer()

    async def _pump(self) -> None:
        try:
            if hasattr(self._source, "__aiter__"):
                async for item in self._source:
                    await self._queue.put((item,))
            else:
                iterator: Iterator[Any] = iter(cast(Iterable[Any], self._source))
                while (item := await asyncio.to_thread(next, iterator, _END)) is not _END:
                    await self._queue.put((item,))
        except Exception as exc:
            await self._queue.put(exc)
            return
        await self._queue.put(_END)

    async def _next(self, timeout: float | None, cancel: CancelSignal) -> Any:
        """Answer ``(item,)``, :data:`_END`, :data:`_TIMEOUT`, or ``None`` when cancelled."""
        getting = asyncio.ensure_future(self._queue.get())
        stopping = asyncio.ensure_future(cancel.wait())
        try:
            done, _ = await asyncio.wait(
                {getting, stopping}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopping.cancel()
        if getting in done:
            got = getting.result()
            if isinstance(got, Exception):
                raise got
            return got
        getting.cancel()
        return None if stopping in done else _TIMEOUT

    async def batch(self, size: int, max_wait: float, cancel: CancelSignal) -> list[Any] | None:
        """Answer the next batch; ``None`` once the source ended; ``[]`` when cancelled first."""
        if self.ended:
            return None
        first = await self._next(None, cancel)
        if first is None:
            return []
        if first is _END:
            self.ended = True
            return None
        items = [first[0]]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait
        while len(items) < size and not cancel.is_set:
            got = await self._next(max(0.0, deadline - loop.time()), cancel)
            if got is _END:
                self.ended = True
                break
            if got is None or got is _TIMEOUT:
                break
            items.append(got[0])
        return items


class ConsumerJob(JobHandle[Any, Any]):
    """A declared consumer: its job (this handle), ``arm``, ``supervisor`` and cursor store.

    Attributes:
        arm: the ``<name>.arm`` job (enqueues this job once per key).
        supervisor: the ``<name>.supervisor`` task (enqueues ``arm`` every ``rearm``).
        cursors: the cursor store.
        batch: the most items per ``handle`` call.
        rearm_ms: the supervisor's period.
    """

    arm: JobHandle[Any, Any]
    supervisor: TaskHandle
    cursors: ConsumerCursor
    batch: int
    rearm_ms: int

    def build_request(self, input: Any, **options: Any) -> EnqueueRequest:
        """Validate one enqueue of a key, as :meth:`jobs_core.JobHandle.build_request` does.

        Raises:
            ConsumerSelfEnqueueError: ``X_CONSUMER_SELF_ENQUEUE`` from inside this consumer's run.
            JobsError: any error of :meth:`jobs_core.JobHandle.build_request`.
        """
        if _RUNNING.get() == self.name:
            raise ConsumerSelfEnqueueError(
                f"consumer {self.name!r} enqueued itself from inside its run: the enqueue would "
                "dedupe onto the running row and arm nothing; answer the next cursor from "
                "handle() and let the supervisor re-arm the keys",
                consumer=self.name,
            )
        return super().build_request(input, **options)

    def describe(self) -> dict[str, Any]:
        """Answer the job's descriptor with the consumer's own settings."""
        return {
            **super().describe(),
            "factory": "consumer",
            "batch": self.batch,
            "rearm_ms": self.rearm_ms,
            "arm": self.arm.name,
            "supervisor": self.supervisor.name,
        }


def rearm_cron(ms: int) -> str | None:
    """Answer the cron expression firing every ``ms`` milliseconds, or ``None`` if none does.

    A cron fires on the wall clock's minutes and hours, so the period must divide an hour (1, 2,
    3, 4, 5, 6, 10, 12, 15, 20 or 30 minutes) or a day (1, 2, 3, 4, 6, 8 or 12 hours, or 1 day).
    """
    if ms % 60_000:
        return None
    minutes = ms // 60_000
    if minutes < 60:
        return None if 60 % minutes else ("* * * * *" if minutes == 1 else f"*/{minutes} * * * *")
    if minutes % 60:
        return None
    hours = minutes // 60
    if hours == 24:
        return "0 0 * * *"
    if hours > 24 or 24 % hours:
        return None
    return "0 * * * *" if hours == 1 else f"0 */{hours} * * *"


def _body(
    name: str,
    open_source: Callable[..., Any],
    handle: Callable[..., Any],
    cursors: ConsumerCursor,
    size: int,
    max_wait: float,
) -> Callable[..., Any]:
    passes_tx = arity(handle) != 1

    async def run(run: ConsumerKey, step: Step, ctx: JobContext) -> dict[str, Any]:
        token = _RUNNING.set(name)
        try:
            cursor = await cursors.load(name, run.key)
            source = await call(open_source, cursor, ctx.cancel)
            batches = 0
            items_seen = 0
            async with _Reader(source, size) as reader:
                while True:
                    items = await reader.batch(size, max_wait, ctx.cancel)
                    if items is None:
                        break
                    if not items:
                        ctx.cancel.raise_if_cancelled()
                        continue
                    where = f"batch:{batches}"
                    if faults.hooked():
                        await faults.boundary("before", name, ctx.run_id, where)
                    async with cursors.transaction() as tx:
                        args = (items, tx) if passes_tx else (items,)
                        cursor = to_json_form(await call(handle, *args))
                        if faults.hooked():
                            await faults.boundary("returned", name, ctx.run_id, where)
                        await cursors.save(CursorWrite(name, run.key, cursor), tx)
                    if faults.hooked():
                        await faults.boundary("persisted", name, ctx.run_id, where)
                    batches += 1
                    items_seen += len(items)
                    ctx.progress(items_seen, None, note=f"{batches} batch(es)")
                    # The drain, a cancel or a lost lease stop the body between batches.
                    ctx.cancel.raise_if_cancelled()
            return {"key": run.key, "batches": batches, "items": items_seen, "cursor": cursor}
        finally:
            _RUNNING.reset(token)

    return run


def consumer(
    *,
    name: str,
    tenant: Callable[[str], str] | Literal["none"],
    keys: Callable[[], Iterable[str]],
    open: Callable[..., Any],
    handle: Callable[..., Any],
    cursor: ConsumerCursor | None = None,
    batch: int = DEFAULT_CONSUMER_BATCH,
    max_wait: Duration = DEFAULT_MAX_WAIT,
    rearm: Duration = DEFAULT_REARM,
    timeout: Duration | None = None,
    queue: str = "default",
    retry: Retry = DEFAULT_RETRY,
    registry: JobRegistry | None = None,
    task_registry: TaskRegistry | None = None,
) -> ConsumerJob:
    """Declare a consumer: its job, its ``.arm`` job and its ``.supervisor`` task.

    Example:
        >>> sync_orders = consumer(
        ...     name="sync-orders",
        ...     tenant="none",
        ...     keys=lambda: ["orders"],
        ...     open=lambda cursor, cancel: feed.since(cursor),  # an async iterable
        ...     handle=upsert_orders,  # async (items, tx) -> next cursor
        ...     cursor=PgCursorStore(pool),
        ... )  # doctest: +SKIP

    Args:
        name: the consumer's job name (``<name>.arm`` and ``<name>.supervisor`` follow it).
        tenant: ``(key) -> org id``, or ``"none"``.
        keys: ``() -> keys`` (sync or async): the keys to keep a body running for.
        open: ``(cursor, cancel) -> items`` (sync or async): an async iterable (or iterable) of
            the items after ``cursor`` (``None`` at first).
        handle: ``(items, tx) -> next cursor`` or ``(items) -> next cursor`` (sync or async):
            writes one batch's effects (on ``tx``, the cursor store's transaction, to commit with
            the cursor) and answers the cursor after them (JSON). At least once per item.
        cursor: **required**: the cursor store (:class:`MemoryCursorStore`,
            ``jobs_pg.PgCursorStore``).
        batch: the most items per ``handle`` call (1..10,000; default 100).
        max_wait: how long a batch waits for more items after its first (``"1s"``).
        rearm: how often the supervisor re-arms the keys (``"1m"``; it must divide an hour or a
            day).
        timeout: must stay ``None``: a consumer runs until drained.
        queue: the queue the bodies and the arm job run on.
        retry: attempts and backoff of a body (default 5 attempts, 1 s doubling to 1 min).
        registry: the job registry to join (default the process-wide one).
        task_registry: the task registry the supervisor joins (default the process-wide one).

    Returns:
        The :class:`ConsumerJob`: ``await sync_orders.enqueue({"key": "orders"})`` starts a key
        by hand; the supervisor does it on its own.

    Raises:
        ConsumerInvalidError: ``X_CONSUMER_INVALID`` naming every bad field (no cursor store, a
            timeout, a bad batch, max_wait or rearm, missing functions).
        JobDuplicateError: ``X_JOB_DUPLICATE`` when another declaration holds a name.
    """
    site = declaration_site()
    problems: list[str] = []
    if cursor is None:
        problems.append("cursor: required, a cursor store (MemoryCursorStore, PgCursorStore)")
    elif not isinstance(cursor, ConsumerCursor):
        problems.append("cursor: must have load(), transaction() and save()")
    if timeout is not None:
        problems.append("timeout: a consumer has none (it runs until drained); leave it out")
    if not is_positive_int(batch, MAX_CONSUMER_BATCH):
        problems.append(f"batch: must be an int 1..{MAX_CONSUMER_BATCH:,}, got {batch!r}")
    wait_problem = duration_problem(max_wait)
    if wait_problem is not None:
        problems.append(f"max_wait: {wait_problem}")
    rearm_problem = duration_problem(rearm)
    cron = None if rearm_problem else rearm_cron(parse_duration(rearm, field="rearm"))
    if rearm_problem is not None or cron is None:
        problems.append(
            f"rearm: {rearm_problem or 'must divide an hour or a day'} (e.g. '1m', '5m', '1h'), "
            f"got {rearm!r}"
        )
    for what, fn in (("keys", keys), ("open", open), ("handle", handle)):
        if not callable(fn):
            problems.append(f"{what}: must be a function")
    if tenant != "none" and not callable(tenant):
        problems.append('tenant: must be a function (key) -> org id, or "none"')
    if problems:
        raise ConsumerInvalidError(
            f"consumer {name!r} is declared wrong: " + "; ".join(problems),
            job=name,
            problems=problems,
        )
    assert cursor is not None and cron is not None
    declared = job(
        input=ConsumerKey,
        idempotency_key=lambda run: f"consumer:{name}:{run.key}",
        tenant="none" if tenant == "none" else (lambda run: tenant(run.key)),
        retry=retry,
        name=name,
        queue=queue,
        registry=registry,
        declared_at=site,
    )(_body(name, open, handle, cursor, batch, parse_duration(max_wait, field="max_wait") / 1000))
    made = adopt(ConsumerJob, declared)

    async def arm_chunk(chunk: Sequence[str]) -> dict[str, int]:
        results = await made.enqueue_many([ConsumerKey(key=k) for k in chunk])
        live = sum(r.deduped for r in results)
        return {"started": len(results) - live, "live": live}

    async def arm_keys(_run: ArmRun, step: Step, ctx: JobContext) -> dict[str, int]:
        found = [str(k) for k in await call(keys)]
        unique = list(dict.fromkeys(found))
        started = live = 0
        for index in range(0, len(unique), ENQUEUE_CHUNK):
            chunk = unique[index : index + ENQUEUE_CHUNK]
            armed = await step.run(f"arm:{index // ENQUEUE_CHUNK}", arm_chunk, chunk)
            started += armed["started"]
            live += armed["live"]
        return {"keys": len(unique), "started": started, "live": live}

    arm = job(
        input=ArmRun,
        idempotency_key=lambda _run: f"consumer:{name}:arm",
        tenant="none",
        name=f"{name}.arm",
        queue=queue,
        registry=registry,
        declared_at=site,
    )(arm_keys)

    def rearm_all(occurrence: datetime) -> list[tuple[JobHandle[Any, Any], Any]]:
        return [(arm, ArmRun())]

    made.arm = arm
    made.supervisor = task(
        cron=cron,
        tz="UTC",
        enqueue=rearm_all,
        catch_up="skip",
        name=f"{name}.supervisor",
        registry=task_registry,
    )
    made.cursors = cursor
    made.batch = batch
    made.rearm_ms = parse_duration(rearm, field="rearm")
    return made
