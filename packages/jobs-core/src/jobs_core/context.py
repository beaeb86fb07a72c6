"""What a job body is handed besides its input: the cancel signal and the job context."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, MutableMapping
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

    def __init__(self) -> None:
        """Create an unfired signal bound to the running loop, if any."""
        self._flag = threading.Event()
        self._event = asyncio.Event()
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._reason: JobsError | None = None
        self._children: list[CancelSignal] = []
        self._lock = threading.Lock()

    @property
    def is_set(self) -> bool:
        """Whether the signal has fired."""
        return self._flag.is_set()

    @property
    def reason(self) -> JobsError | None:
        """The error that fired it (its ``code`` says why), or ``None``."""
        return self._reason

    def fire(self, reason: JobsError) -> None:
        """Fire the signal (and its children) with ``reason``; later calls change nothing.

        Safe to call from any thread.
        """
        with self._lock:
            if self._flag.is_set():
                return
            self._reason = reason
            self._flag.set()
            children = list(self._children)
        if self._loop is not None and not self._loop.is_closed():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is self._loop:
                self._event.set()
            else:
                self._loop.call_soon_threadsafe(self._event.set)
        else:
            self._event.set()
        for child in children:
            child.fire(reason)

    def child(self) -> CancelSignal:
        """Answer a new signal that fires when this one does (already fired if this one has)."""
        sub = CancelSignal()
        with self._lock:
            self._children.append(sub)
            reason = self._reason
        if reason is not None:
            sub.fire(reason)
        return sub

    async def wait(self) -> JobsError:
        """Wait until the signal fires; answer its reason."""
        await self._event.wait()
        assert self._reason is not None
        return self._reason

    def wait_sync(self, timeout: float | None = None) -> bool:
        """Block a worker thread until the signal fires or ``timeout`` seconds pass.

        Returns:
            Whether the signal fired.
        """
        return self._flag.wait(timeout)

    def raise_if_cancelled(self) -> None:
        """Raise the firing error (``X_DRAINING``, ``X_JOB_TIMEOUT``, ...) if the signal fired."""
        reason = self._reason
        if reason is not None:
            raise type(reason)(reason.message, **reason.meta)


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
