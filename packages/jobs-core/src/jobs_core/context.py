"""What a job body is handed besides its input: the cancel signal and the job context."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from jobs_core.errors import JobsError
from jobs_core.types import JSONValue


class CancelSignal:
    """A one-shot cancellation signal usable from async code and from worker threads.

    The worker fires it when the attempt should stop: the worker drains (``X_DRAINING``), the
    attempt's ``timeout`` passes (``X_JOB_TIMEOUT``), an operator cancels the job
    (``X_JOB_CANCELLED``) or the lease is lost (``X_JOB_LEASE_LOST``). A step's signal is a child of
    its attempt's: firing the parent fires the child.
    """

    __slots__ = ("_children", "_event", "_flag", "_lock", "_loop", "_reason")

    def __init__(self) -> None:
        """Create an unfired signal bound to the running loop, if any."""
        # The events are made on the first wait: most signals never fire and nobody waits on
        # them, and a threading.Event costs a Condition and two locks (one per job and step).
        # ``_reason`` is the flag itself; the lock orders it against a waiter making its event.
        self._flag: threading.Event | None = None
        self._event: asyncio.Event | None = None
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._reason: JobsError | None = None
        self._children: list[CancelSignal] | None = None
        self._lock = threading.Lock()

    @property
    def is_set(self) -> bool:
        """Whether the signal has fired."""
        return self._reason is not None

    @property
    def reason(self) -> JobsError | None:
        """The error that fired it (its ``code`` says why), or ``None``."""
        return self._reason

    def fire(self, reason: JobsError) -> None:
        """Fire the signal (and its children) with ``reason``; later calls change nothing.

        Safe to call from any thread.
        """
        with self._lock:
            if self._reason is not None:
                return
            self._reason = reason
            flag, event, children = self._flag, self._event, self._children
        if flag is not None:
            flag.set()
        if event is not None:
            if self._loop is not None and not self._loop.is_closed():
                try:
                    running = asyncio.get_running_loop()
                except RuntimeError:
                    running = None
                if running is self._loop:
                    event.set()
                else:
                    self._loop.call_soon_threadsafe(event.set)
            else:
                event.set()
        for child in children or ():
            child.fire(reason)

    def child(self) -> CancelSignal:
        """Answer a new signal that fires when this one does (already fired if this one has)."""
        sub = CancelSignal()
        with self._lock:
            if self._children is None:
                self._children = []
            self._children.append(sub)
            reason = self._reason
        if reason is not None:
            sub.fire(reason)
        return sub

    async def wait(self) -> JobsError:
        """Wait until the signal fires; answer its reason."""
        with self._lock:
            reason = self._reason
            if reason is None and self._event is None:
                self._event = asyncio.Event()
            event = self._event
        if reason is None:
            assert event is not None
            await event.wait()
            reason = self._reason
        assert reason is not None
        return reason

    def wait_sync(self, timeout: float | None = None) -> bool:
        """Block a worker thread until the signal fires or ``timeout`` seconds pass.

        Returns:
            Whether the signal fired.
        """
        with self._lock:
            if self._reason is not None:
                return True
            if self._flag is None:
                self._flag = threading.Event()
            flag = self._flag
        return flag.wait(timeout)

    def raise_if_cancelled(self) -> None:
        """Raise the firing error (``X_DRAINING``, ``X_JOB_TIMEOUT``, ...) if the signal fired."""
        reason = self._reason
        if reason is not None:
            raise type(reason)(reason.message, **reason.meta)


class JobIds(Mapping[str, object]):
    """The ids a :class:`JobLogger` binds (``job_id``, ``run_id``, ``attempt``), as a mapping.

    The UUIDs become text on the first read, not per attempt: most bodies never log.
    """

    __slots__ = ("_attempt", "_fields", "_job_id", "_run_id")

    def __init__(self, job_id: UUID | None, run_id: UUID, attempt: int | None) -> None:
        """Bind ``run_id`` and, when given, ``job_id`` and ``attempt``."""
        self._job_id = job_id
        self._run_id = run_id
        self._attempt = attempt
        self._fields: dict[str, object] | None = None

    def _built(self) -> dict[str, object]:
        fields = self._fields
        if fields is None:
            fields = {} if self._job_id is None else {"job_id": str(self._job_id)}
            fields["run_id"] = str(self._run_id)
            if self._attempt is not None:
                fields["attempt"] = self._attempt
            self._fields = fields
        return fields

    def __getitem__(self, key: str) -> object:
        """Answer the bound value of ``key`` (``KeyError`` if unbound)."""
        return self._built()[key]

    def __iter__(self) -> Iterator[str]:
        """Iterate over the bound keys."""
        return iter(self._built())

    def __len__(self) -> int:
        """Answer how many fields are bound."""
        return len(self._built())


class JobLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger adapter that adds the ids it is bound to to every record's ``extra``.

    The stdlib adapter (before Python 3.13's ``merge_extra``) replaces a call's own ``extra=``
    with the bound fields, so a body's ``ctx.log.info("sent", extra={"to": n})`` would lose
    ``to``. Here both land; on a key both name, the bound id wins, so a record always says which
    job and run it came from.
    """

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        """Merge the call's ``extra`` with the bound fields (bound ones win)."""
        kwargs["extra"] = {**(kwargs.get("extra") or {}), **(self.extra or {})}
        return msg, kwargs


@dataclass(slots=True)
class JobContext:
    """The third argument of a job body.

    Attributes:
        job_id: the row's id.
        run_id: the run's id (stable across attempts and suspensions).
        name: the job name.
        queue: the queue it runs on.
        attempt: this attempt (1-based).
        final_attempt: ``True`` when a failure now is not retried for want of attempts.
        tenant_id: the row's tenant (``None`` for ``tenant="none"`` jobs).
        cancel: fires when the attempt should stop (see :class:`CancelSignal`).
        log: a logger bound to the job and run ids (and attempt); a call's own ``extra=`` is
            merged with them (:class:`JobLogger`).
    """

    job_id: UUID | None
    run_id: UUID
    name: str
    queue: str
    attempt: int
    final_attempt: bool
    tenant_id: str | None
    cancel: CancelSignal
    log: logging.LoggerAdapter[logging.Logger]
    _report: Callable[[JSONValue], None] | None = field(default=None, repr=False)

    def progress(
        self, done: int | float, total: int | float | None = None, note: str | None = None
    ) -> None:
        """Report progress; stored on the row (at most one write per second, plus the last).

        Non-blocking and callable from async or sync bodies.

        Args:
            done: units finished so far.
            total: units in all, if known.
            note: a short human note (no payload data).
        """
        if self._report is not None:
            self._report({"done": done, "total": total, "note": note})
