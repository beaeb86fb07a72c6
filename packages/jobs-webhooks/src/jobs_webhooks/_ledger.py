"""The delivery ledger: every attempt at an endpoint, and each endpoint's health.

A delivery writes its attempt's row **before** it raises or returns, so what the endpoint's owner
sees (status, excerpt, timing) is never lost to a retry. The same write counts consecutive
failures and disables the endpoint at ``disable_after``; a delivered attempt resets the count.
Re-enabling is the app's call (:meth:`WebhookLedger.enable`), never automatic: an endpoint that
failed ten times in a row is fixed by a person.

What a row holds is chosen so the ledger can be shown to the endpoint's owner: the URL without
its user info and query (where tokens live), the status, and an excerpt of the response of at
most :data:`EXCERPT_CHARS` printable ASCII characters (anything else escaped). Never the request
body, never a secret.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable
from uuid import UUID

from jobs_core.clock import SYSTEM_CLOCK, Clock

Outcome = Literal["delivered", "failed", "throttled", "rejected", "refused"]
"""What one attempt came to: ``delivered`` (2xx), ``failed`` (retried on the backoff),
``throttled`` (429/503 with Retry-After), ``rejected`` (410 or another permanent status),
``refused`` (the endpoint could not be dialled: a bad URL or an SSRF refusal)."""

OUTCOMES: tuple[Outcome, ...] = ("delivered", "failed", "throttled", "rejected", "refused")

EXCERPT_CHARS = 512
"""The longest response excerpt a row keeps, in characters after escaping."""

MAX_ATTEMPTS_LISTED = 1000
"""The most rows one :meth:`WebhookLedger.attempts` call answers."""


def excerpt(data: bytes | str, limit: int = EXCERPT_CHARS) -> str:
    r"""Answer a bounded, escaped excerpt of a response body or an error message.

    The text is decoded as UTF-8 (bad bytes replaced), then every character outside printable
    ASCII is escaped as JSON escapes it (``\n``, ``\u00e9``, ...), so no control sequence
    reaches a terminal or a log line (a page still escapes it as any text). It is cut at
    ``limit`` characters, never inside an escape, with ``...`` marking the cut.
    """
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    pieces: list[str] = []
    used = 0
    for char in text:
        # JSON leaves DEL (0x7f) as it is; it is a control character too.
        piece = json.dumps(char)[1:-1] if char != "\x7f" else "\\u007f"
        if used + len(piece) > limit:
            while pieces and used > limit - 3:
                used -= len(pieces.pop())
            return "".join(pieces) + "..."
        pieces.append(piece)
        used += len(piece)
    return "".join(pieces)


@dataclass(frozen=True, slots=True)
class DeliveryAttempt:
    """One attempt at delivering one event to one endpoint: one ledger row.

    Attributes:
        endpoint_id: the endpoint's id.
        event_id: the message id sent as ``webhook-id`` (the same on every attempt).
        topic: the event's topic.
        attempt: the job attempt (1-based).
        url: the URL without user info or query.
        started_at: when the attempt began (aware, UTC).
        duration_ms: how long it took (ms).
        outcome: see :data:`Outcome`.
        status: the HTTP status, or ``None`` when no response came.
        code: the ``X_…`` code the attempt raised, if any.
        excerpt: the escaped start of the response body or of the error (see :func:`excerpt`).
        retry_after_ms: the delay chosen for the next attempt (ms), when one was.
        job_id: the delivery job's id.
        run_id: the delivery job's run id.
    """

    endpoint_id: str
    event_id: str
    topic: str
    attempt: int
    url: str
    started_at: datetime
    duration_ms: float
    outcome: Outcome
    status: int | None = None
    code: str | None = None
    excerpt: str = ""
    retry_after_ms: int | None = None
    job_id: UUID | None = None
    run_id: UUID | None = None


@dataclass(frozen=True, slots=True)
class EndpointHealth:
    """An endpoint's standing in the ledger.

    Attributes:
        endpoint_id: the endpoint's id.
        consecutive_failures: attempts that failed since the last delivered one.
        disabled_at: when it was disabled (aware, UTC), or ``None`` while enabled.
    """

    endpoint_id: str
    consecutive_failures: int = 0
    disabled_at: datetime | None = None

    @property
    def disabled(self) -> bool:
        """Whether deliveries to this endpoint are refused."""
        return self.disabled_at is not None


@runtime_checkable
class WebhookLedger(Protocol):
    """Where deliveries record their attempts and read their endpoint's health."""

    async def record(
        self, attempt: DeliveryAttempt, *, disable_after: int | None
    ) -> EndpointHealth:
        """Store ``attempt`` and update its endpoint's failure count in one write.

        A ``delivered`` attempt resets the count; any other outcome adds one, and reaching
        ``disable_after`` (``None``: never) disables the endpoint. Answers the health after it.
        """
        ...

    async def is_disabled(self, endpoint_id: str) -> bool:
        """Answer whether the endpoint is disabled (an unknown endpoint is enabled)."""
        ...

    async def health(self, endpoint_id: str) -> EndpointHealth:
        """Answer the endpoint's health (zero failures for an unknown endpoint)."""
        ...

    async def enable(self, endpoint_id: str) -> None:
        """Re-enable the endpoint and reset its failure count."""
        ...

    async def disable(self, endpoint_id: str) -> None:
        """Disable the endpoint now (an app's own decision: a deleted subscription, abuse)."""
        ...

    async def attempts(
        self, *, endpoint_id: str | None = None, event_id: str | None = None, limit: int = 100
    ) -> list[DeliveryAttempt]:
        """Answer recorded attempts, newest first, filtered by endpoint and/or event.

        ``limit`` is 1 to :data:`MAX_ATTEMPTS_LISTED`.
        """
        ...

    async def purge(self, before: datetime) -> int:
        """Delete attempts that started before ``before`` (aware); answer how many."""
        ...


def check_limit(limit: int) -> int:
    """Answer ``limit`` if it is 1 to :data:`MAX_ATTEMPTS_LISTED`.

    Raises:
        ValueError: any other value.
    """
    if (
        isinstance(limit, bool)
        or not isinstance(limit, int)
        or not 1 <= limit <= MAX_ATTEMPTS_LISTED
    ):
        raise ValueError(f"limit: must be an int from 1 to {MAX_ATTEMPTS_LISTED}, got {limit!r}")
    return limit


class MemoryWebhookLedger:
    """A :class:`WebhookLedger` in this process's memory, for development and tests.

    Args:
        keep: the newest attempts kept (older ones are dropped first).
        clock: what stamps a manual :meth:`disable`.
    """

    def __init__(self, *, keep: int = 10_000, clock: Clock = SYSTEM_CLOCK) -> None:
        self._attempts: deque[DeliveryAttempt] = deque(maxlen=keep)
        self._health: dict[str, EndpointHealth] = {}
        self._clock = clock

    async def record(
        self, attempt: DeliveryAttempt, *, disable_after: int | None
    ) -> EndpointHealth:
        """Store ``attempt`` and update its endpoint's count (see :class:`WebhookLedger`)."""
        self._attempts.append(attempt)
        health = self._health.get(attempt.endpoint_id, EndpointHealth(attempt.endpoint_id))
        if attempt.outcome == "delivered":
            health = replace(health, consecutive_failures=0)
        else:
            failures = health.consecutive_failures + 1
            disabled_at = health.disabled_at
            if disabled_at is None and disable_after is not None and failures >= disable_after:
                disabled_at = attempt.started_at
            health = replace(health, consecutive_failures=failures, disabled_at=disabled_at)
        self._health[attempt.endpoint_id] = health
        return health

    async def is_disabled(self, endpoint_id: str) -> bool:
        """Answer whether the endpoint is disabled."""
        return (await self.health(endpoint_id)).disabled

    async def health(self, endpoint_id: str) -> EndpointHealth:
        """Answer the endpoint's health."""
        return self._health.get(endpoint_id, EndpointHealth(endpoint_id))

    async def enable(self, endpoint_id: str) -> None:
        """Re-enable the endpoint and reset its failure count."""
        self._health[endpoint_id] = EndpointHealth(endpoint_id)

    async def disable(self, endpoint_id: str) -> None:
        """Disable the endpoint now."""
        health = await self.health(endpoint_id)
        if health.disabled_at is None:
            self._health[endpoint_id] = replace(health, disabled_at=self._clock.now())

    async def attempts(
        self, *, endpoint_id: str | None = None, event_id: str | None = None, limit: int = 100
    ) -> list[DeliveryAttempt]:
        """Answer recorded attempts, newest first.

        Raises:
            ValueError: ``limit`` outside 1 to :data:`MAX_ATTEMPTS_LISTED`.
        """
        check_limit(limit)
        found: list[DeliveryAttempt] = []
        for row in reversed(self._attempts):
            if endpoint_id is not None and row.endpoint_id != endpoint_id:
                continue
            if event_id is not None and row.event_id != event_id:
                continue
            found.append(row)
            if len(found) == limit:
                break
        return found

    async def purge(self, before: datetime) -> int:
        """Delete attempts that started before ``before``; answer how many."""
        kept: Sequence[DeliveryAttempt] = [a for a in self._attempts if a.started_at >= before]
        dropped = len(self._attempts) - len(kept)
        self._attempts = deque(kept, maxlen=self._attempts.maxlen)
        return dropped


def memory_webhook_ledger(
    *, keep: int = 10_000, clock: Clock = SYSTEM_CLOCK
) -> MemoryWebhookLedger:
    """Answer a ledger in this process's memory (dev and tests: nothing survives a restart).

    Args:
        keep: the newest attempts kept.
        clock: what stamps a manual disable.
    """
    return MemoryWebhookLedger(keep=keep, clock=clock)
