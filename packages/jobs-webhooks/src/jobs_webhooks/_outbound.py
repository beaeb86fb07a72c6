"""Outbound webhooks: :func:`webhook` delivers one event to one endpoint, as a job.

Each attempt reads the endpoint (it holds the secrets) and the event afresh, never from a step,
asks the ledger whether the endpoint is disabled, resolves and checks its host
(:mod:`jobs_webhooks._ssrf`), signs the body at its own send time and POSTs it without following
redirects, reads at most ``max_response_bytes`` of the answer, and writes the attempt to the
ledger before it returns or raises.

Delays are chosen here, where the ledger records them, not again by the core: the job is
declared to the core with ``jitter=False`` and every failure carries its delay in
``meta["retry_after_seconds"]``, which the core then keeps as it is. A throttled attempt waits at
least what was asked (:meth:`jobs_core.Retry.after_ms`: up to a quarter more, clamped by
``max_delay``); another failure waits the policy's own jittered backoff.

The drain never aborts a POST on the wire (the receiver may be processing it; an abort would only
make the retry a duplicate) but stops one not yet sent. Any other cancel of ours (the job's
deadline, a lost lease, an operator's cancel) aborts the request and writes no ledger row: the
failure was ours, not the endpoint's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import inspect
import logging
import math
import random
import ssl
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

import httpx
import pydantic_core

from jobs_core import SYSTEM_CLOCK, Clock, Concurrency, JobContext, Retry, job
from jobs_core._durations import Duration, duration_problem, parse_duration
from jobs_core.errors import (
    DrainingError,
    JobDeclarationInvalidError,
    JobsError,
    WebhookDeliveryFailedError,
    WebhookDeliveryRejectedError,
    WebhookDeliveryThrottledError,
    WebhookEndpointDisabledError,
    WebhookEndpointInvalidError,
    WebhookEventMissingError,
    classification_of,
)
from jobs_core.job import JobHandle, JobRegistry, declaration_site
from jobs_core.types import EnqueueResult, JSONValue
from jobs_webhooks._delays import retry_after_seconds
from jobs_webhooks._endpoint import Endpoint, WebhookEvent, body_bytes, shown_url, target
from jobs_webhooks._ledger import DeliveryAttempt, Outcome, WebhookLedger, excerpt
from jobs_webhooks._signing import sign_standard_webhook
from jobs_webhooks._ssrf import AddressGuard
from jobs_webhooks._transport import Clients, pinned

I = TypeVar("I")  # noqa: E741 - the input type, as in jobs_core.job

_log = logging.getLogger("jobs.webhooks")

DEFAULT_RETRY = Retry(attempts=10, backoff="exponential", delay="30s", max_delay="6h")
"""Ten attempts over about four hours: 30 s, 1 m, 2 m, ... 2 h 8 m between them, jittered."""

MAX_RESPONSE_BYTES = 65_536
"""The most of a response body an attempt reads (the rest is never read)."""

# Headers we set on every delivery: an endpoint's own value for one of them is never sent.
_OURS = frozenset(
    {
        "content-type",
        "user-agent",
        "accept-encoding",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "webhook-topic",
    }
)
# Framing and routing headers an endpoint may not set: they would change where or how the
# signed body goes, not what it says.
_DROPPED = frozenset({"host", "content-length", "transfer-encoding", "connection", "te", "upgrade"})


@dataclass(slots=True)
class _Sent:
    status: int
    headers: httpx.Headers
    head: bytes
    received: datetime


async def _answer(fn: Callable[[Any], Any], value: Any) -> Any:
    result = fn(value)
    return await result if inspect.isawaitable(result) else result


class Delivery:
    """One declared webhook's delivery logic (the job body calls :meth:`attempt`)."""

    def __init__(
        self,
        *,
        name: str,
        endpoint: Callable[[Any], Any],
        event: Callable[[Any], Any],
        ledger: WebhookLedger,
        retry: Retry,
        disable_after: int | None,
        timeout_ms: int,
        reject_statuses: frozenset[int],
        max_response_bytes: int,
        guard: AddressGuard,
        clock: Clock,
        user_agent: str,
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        self.name = name
        self.endpoint = endpoint
        self.event = event
        self.ledger = ledger
        self.retry = retry
        self.disable_after = disable_after
        self.timeout_s = timeout_ms / 1000
        self.reject_statuses = reject_statuses
        self.max_response_bytes = max_response_bytes
        self.guard = guard
        self.clock = clock
        self.user_agent = user_agent
        self.clients = Clients(ssl_context)
        self.rng = random.Random()

    async def body(self, input: Any, step: Any, ctx: JobContext) -> None:
        """The job body: one attempt; every failure raises with its delay attached."""
        try:
            await self.attempt(input, ctx)
        except JobsError:
            raise
        except Exception as exc:
            if classification_of(exc) != "retry":
                raise
            # An app lookup or the ledger failed: retried on the jittered backoff, not in step
            # with every other delivery that failed at the same moment.
            raise WebhookDeliveryFailedError(
                f"a delivery of {self.name} raised {type(exc).__name__}",
                stage="delivery",
                retry_after_seconds=self.retry.delay_after_ms(ctx.attempt) / 1000,
            ) from exc

    async def attempt(self, input: Any, ctx: JobContext) -> None:
        """Deliver once: the ledger row is written before this returns or raises."""
        endpoint = await _answer(self.endpoint, input)
        if endpoint is None:
            raise WebhookEndpointInvalidError(
                f"endpoint(input) of {self.name} found no endpoint", reason="missing"
            )
        if not isinstance(endpoint, Endpoint):
            raise WebhookEndpointInvalidError(
                f"endpoint(input) of {self.name} must answer an Endpoint, not "
                f"{type(endpoint).__name__}",
                reason="type",
            )
        if await self.ledger.is_disabled(endpoint.id):
            raise WebhookEndpointDisabledError(
                f"endpoint {endpoint.id!r} is disabled in the ledger; nothing was sent",
                endpoint_id=endpoint.id,
            )
        event = await _answer(self.event, input)
        if event is None:
            raise WebhookEventMissingError(f"event(input) of {self.name} found no event")
        if not isinstance(event, WebhookEvent):
            raise WebhookEventMissingError(
                f"event(input) of {self.name} must answer a WebhookEvent, not "
                f"{type(event).__name__}"
            )
        body = body_bytes(event)
        ctx.cancel.raise_if_cancelled()
        row = _Row(self, endpoint, event, ctx)
        url = target(endpoint.url)
        row.url = shown_url(url)
        host, port = (
            url.raw_host.decode("ascii"),
            url.port or (443 if url.scheme == "https" else 80),
        )
        try:
            addresses = await self.guard.check(host, port, allow_private=endpoint.allow_private)
        except WebhookEndpointInvalidError as exc:
            await row.write("refused", code=exc.code, detail=exc.message)
            raise
        except OSError as exc:
            raise await row.failed(None, f"{type(exc).__name__}: {exc}") from exc
        # Last look before the socket: a drain that began meanwhile stops an unsent POST.
        ctx.cancel.raise_if_cancelled()
        request = self._request(endpoint, event, url, body)
        sent = await self._send(request, host, port, addresses, endpoint.allow_private, ctx, row)
        await self._settle(sent, row)

    def _request(
        self, endpoint: Endpoint, event: WebhookEvent, url: httpx.URL, body: bytes
    ) -> httpx.Request:
        headers = httpx.Headers(
            {k: v for k, v in endpoint.headers.items() if k.lower() not in _DROPPED | _OURS}
        )
        headers["content-type"] = "application/json"
        headers["user-agent"] = self.user_agent
        # identity: a compressed answer would be inflated while read, past the read cap.
        headers["accept-encoding"] = "identity"
        headers["webhook-topic"] = event.topic
        # Signed at this attempt's send time: a retry an hour later carries a fresh timestamp.
        stamp = math.floor(self.clock.now().timestamp())
        for key, value in sign_standard_webhook(event.id, stamp, body, endpoint.secrets).items():
            headers[key] = value
        timeout = httpx.Timeout(self.timeout_s)
        return httpx.Request(
            "POST", url, headers=headers, content=body, extensions={"timeout": timeout.as_dict()}
        )

    async def _send(
        self,
        request: httpx.Request,
        host: str,
        port: int,
        addresses: list[str],
        allow_private: bool,
        ctx: JobContext,
        row: _Row,
    ) -> _Sent:
        client = self.clients.get(allow_private=allow_private)
        exchange = asyncio.ensure_future(self._exchange(client, request, host, port, addresses))
        aborting = asyncio.ensure_future(_abort_signal(ctx))
        try:
            await asyncio.wait({exchange, aborting}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            aborting.cancel()
            if not exchange.done():
                exchange.cancel()
                with contextlib.suppress(BaseException):
                    await exchange
        if exchange.cancelled():
            # Our own cancel (deadline, lost lease, operator): no ledger row.
            ctx.cancel.raise_if_cancelled()
        try:
            return exchange.result()
        except (httpx.HTTPError, OSError, TimeoutError) as exc:
            detail = (
                "TimeoutError: no answer within the timeout"
                if isinstance(exc, TimeoutError)
                else f"{type(exc).__name__}: {exc}"
            )
            raise await row.failed(None, detail) from exc

    async def _exchange(
        self,
        client: httpx.AsyncClient,
        request: httpx.Request,
        host: str,
        port: int,
        addresses: list[str],
    ) -> _Sent:
        with pinned(host, port, addresses):
            # One deadline over connect, send and the capped read: a receiver trickling its
            # answer a byte at a time cannot hold the worker's slot past it.
            async with asyncio.timeout(self.timeout_s):
                response = await client.send(request, stream=True)
                try:
                    head = bytearray()
                    async for chunk in response.aiter_raw():
                        head += chunk
                        if len(head) >= self.max_response_bytes:
                            break
                finally:
                    await response.aclose()
        return _Sent(
            response.status_code,
            response.headers,
            bytes(head[: self.max_response_bytes]),
            self.clock.now(),
        )

    async def _settle(self, sent: _Sent, row: _Row) -> None:
        status = sent.status
        if 200 <= status < 300:
            await row.write("delivered", status=status, detail=sent.head)
            return
        if status in self.reject_statuses:
            await row.write(
                "rejected", status=status, code=WebhookDeliveryRejectedError.code, detail=sent.head
            )
            raise WebhookDeliveryRejectedError(
                f"endpoint {row.endpoint.id!r} answered {status}, a permanent refusal",
                endpoint_id=row.endpoint.id,
                status=status,
            )
        asked = None
        if status in (429, 503):
            asked = retry_after_seconds(
                sent.headers.get("retry-after"), sent.headers.get("date"), sent.received
            )
        if asked is None:
            what = (
                f"a redirect ({status}); redirects are never followed"
                if 300 <= status < 400
                else str(status)
            )
            raise await row.failed(status, sent.head, answered=what)
        delay_ms = self.retry.after_ms(math.ceil(asked * 1000), self.rng)
        await row.write(
            "throttled",
            status=status,
            code=WebhookDeliveryThrottledError.code,
            detail=sent.head,
            retry_after_ms=delay_ms,
        )
        raise WebhookDeliveryThrottledError(
            f"endpoint {row.endpoint.id!r} answered {status} with Retry-After; retrying in "
            f"{delay_ms} ms",
            endpoint_id=row.endpoint.id,
            status=status,
            asked_seconds=asked,
            retry_after_seconds=delay_ms / 1000,
        )


async def _abort_signal(ctx: JobContext) -> None:
    """Return when a cancel of ours should abort the request on the wire (never the drain)."""
    reason = await ctx.cancel.wait()
    if isinstance(reason, DrainingError):
        await asyncio.Event().wait()


class _Row:
    """The ledger row of one attempt, written once before the attempt returns or raises."""

    def __init__(
        self, delivery: Delivery, endpoint: Endpoint, event: WebhookEvent, ctx: JobContext
    ) -> None:
        self.delivery = delivery
        self.endpoint = endpoint
        self.event = event
        self.ctx = ctx
        self.url = ""
        self.started_at = delivery.clock.now()
        self.started = delivery.clock.monotonic()

    async def write(
        self,
        outcome: Outcome,
        *,
        status: int | None = None,
        code: str | None = None,
        detail: bytes | str = b"",
        retry_after_ms: int | None = None,
    ) -> None:
        d = self.delivery
        attempt = DeliveryAttempt(
            endpoint_id=self.endpoint.id,
            event_id=self.event.id,
            topic=self.event.topic,
            attempt=self.ctx.attempt,
            url=self.url,
            started_at=self.started_at,
            duration_ms=(d.clock.monotonic() - self.started) * 1000,
            outcome=outcome,
            status=status,
            code=code,
            excerpt=excerpt(detail),
            retry_after_ms=retry_after_ms,
            job_id=self.ctx.job_id,
            run_id=self.ctx.run_id,
        )
        health = await d.ledger.record(attempt, disable_after=d.disable_after)
        if health.disabled_at is not None and outcome != "delivered":
            _log.warning(
                "jobs.webhook.endpoint-disabled",
                extra={
                    "event": "jobs.webhook.endpoint-disabled",
                    "job": d.name,
                    "endpoint_id": self.endpoint.id,
                    "consecutive_failures": health.consecutive_failures,
                },
            )

    async def failed(
        self, status: int | None, detail: bytes | str, answered: str | None = None
    ) -> WebhookDeliveryFailedError:
        """Write a ``failed`` row; answer the error to raise, its backoff delay attached."""
        delay_ms = self.delivery.retry.delay_after_ms(self.ctx.attempt)
        await self.write(
            "failed",
            status=status,
            code=WebhookDeliveryFailedError.code,
            detail=detail,
            retry_after_ms=delay_ms,
        )
        return WebhookDeliveryFailedError(
            f"endpoint {self.endpoint.id!r} "
            + (f"answered {answered}" if answered else "could not be reached"),
            endpoint_id=self.endpoint.id,
            status=status,
            retry_after_seconds=delay_ms / 1000,
        )


def _input_key(value: Any) -> str:
    """The default idempotency key: one live delivery per distinct input."""
    return "webhook:" + hashlib.sha256(pydantic_core.to_json(value)).hexdigest()


class WebhookJob(Generic[I]):
    """A declared webhook: enqueue deliveries; the job itself is :attr:`job`.

    Attributes:
        job: the :class:`~jobs_core.JobHandle` the worker runs.
        ledger: the ledger its attempts go to.
    """

    def __init__(self, handle: JobHandle[I, None], delivery: Delivery) -> None:
        self.job = handle
        self.ledger = delivery.ledger
        self._delivery = delivery

    @property
    def name(self) -> str:
        """The job's durable name."""
        return self.job.name

    async def enqueue(self, input: I | JSONValue, **options: Any) -> EnqueueResult:
        """Queue one delivery: :meth:`jobs_core.JobHandle.enqueue` (same options and errors)."""
        return await self.job.enqueue(input, **options)

    def enqueue_sync(self, input: I | JSONValue, **options: Any) -> EnqueueResult:
        """:meth:`enqueue` for sync code: :meth:`jobs_core.JobHandle.enqueue_sync`."""
        return self.job.enqueue_sync(input, **options)

    async def enqueue_many(
        self, inputs: Sequence[I | JSONValue], **options: Any
    ) -> list[EnqueueResult]:
        """Queue many deliveries (a fan-out): :meth:`jobs_core.JobHandle.enqueue_many`."""
        return await self.job.enqueue_many(inputs, **options)

    def describe(self) -> dict[str, Any]:
        """Answer the job's descriptor with the webhook's own settings."""
        d = self._delivery
        return {
            **self.job.describe(),
            "factory": "webhook",
            "disable_after": d.disable_after,
            "timeout_ms": int(d.timeout_s * 1000),
            "reject_statuses": sorted(d.reject_statuses),
            "max_response_bytes": d.max_response_bytes,
        }

    async def aclose(self) -> None:
        """Close the kept-alive connections this event loop holds (a clean shutdown)."""
        await self._delivery.clients.aclose()


def webhook(
    *,
    name: str,
    input: Any,
    endpoint: Callable[[Any], Endpoint | Awaitable[Endpoint | None] | None],
    event: Callable[[Any], WebhookEvent | Awaitable[WebhookEvent | None] | None],
    ledger: WebhookLedger,
    tenant: Callable[[Any], str] | Literal["none"],
    idempotency_key: Callable[[Any], str] | None = None,
    retry: Retry = DEFAULT_RETRY,
    disable_after: int | None = 10,
    timeout: Duration = "10s",
    queue: str = "default",
    concurrency: int | Concurrency | None = None,
    reject_statuses: Collection[int] = frozenset({410}),
    max_response_bytes: int = MAX_RESPONSE_BYTES,
    guard: AddressGuard | None = None,
    clock: Clock = SYSTEM_CLOCK,
    user_agent: str = "jobs-webhooks/0.1",
    ssl_context: ssl.SSLContext | None = None,
    registry: JobRegistry | None = None,
) -> WebhookJob[Any]:
    """Declare a job that delivers one event to one endpoint in the Standard Webhooks format.

    Args:
        name: the job's durable name (rows carry it).
        input: the input type (a pydantic model naming the endpoint and the event, and the
            tenant when there is one).
        endpoint: ``(input) -> Endpoint | None`` (sync or async), read at every attempt and never
            stored in a step (it holds the secrets). ``None``: the endpoint is gone (terminal).
        event: ``(input) -> WebhookEvent | None`` (sync or async), read at every attempt.
            ``None``: the event is gone (terminal, ``X_WEBHOOK_EVENT_MISSING``).
        ledger: where attempts are recorded and endpoints disabled
            (:func:`~jobs_webhooks.memory_webhook_ledger`,
            :class:`~jobs_webhooks.PostgresWebhookLedger`).
        tenant: ``(input) -> org id`` or ``"none"``, as for :func:`jobs_core.job`.
        idempotency_key: ``(input) -> str``; default: a hash of the whole input, so one live
            delivery per (endpoint, event) input.
        retry: attempts and backoff (:data:`DEFAULT_RETRY`); ``max_delay`` also clamps a
            ``Retry-After``.
        disable_after: consecutive failed attempts that disable the endpoint (``None``: never).
        timeout: one attempt's deadline over connect, send and read (10 s). Keep it below the
            worker's drain budget (25 s): a drain waits for a POST on the wire.
        queue: the queue deliveries run on.
        concurrency: a fleet-wide cap, e.g. ``Concurrency(key=lambda i: i.endpoint_id,
            limit=4)`` so one slow endpoint cannot hold every slot.
        reject_statuses: statuses that end the delivery for good (410 Gone).
        max_response_bytes: the most of a response body read (64 KiB).
        guard: the SSRF guard (default :class:`~jobs_webhooks.AddressGuard` with the system
            resolver).
        clock: the clock that stamps signatures and ledger rows.
        user_agent: the ``User-Agent`` sent.
        ssl_context: what verifies endpoints' certificates (default: httpx's, the certifi CAs),
            e.g. one that also trusts a corporate CA.
        registry: the job registry to join (default the process-wide one).

    Returns:
        The :class:`WebhookJob`: ``await deliver.enqueue(DeliveryInput(...))`` per endpoint.

    Raises:
        JobDeclarationInvalidError: ``X_JOB_DECLARATION_INVALID`` naming every bad field (the
            job's own fields are checked by :func:`jobs_core.job` as well).
    """
    # First: the app's call site tells a reload of this declaration from a second one.
    site = declaration_site()
    problems: list[str] = []
    if not callable(endpoint):
        problems.append("endpoint: must be a function (input) -> Endpoint | None")
    if not callable(event):
        problems.append("event: must be a function (input) -> WebhookEvent | None")
    if not isinstance(ledger, WebhookLedger):
        problems.append(
            "ledger: must be a WebhookLedger (memory_webhook_ledger(), PostgresWebhookLedger)"
        )
    if disable_after is not None and (
        isinstance(disable_after, bool) or not isinstance(disable_after, int) or disable_after < 1
    ):
        problems.append(f"disable_after: must be an int >= 1 or None, got {disable_after!r}")
    timeout_problem = duration_problem(timeout)
    if timeout_problem is not None:
        problems.append(f"timeout: {timeout_problem}")
    if (
        isinstance(max_response_bytes, bool)
        or not isinstance(max_response_bytes, int)
        or max_response_bytes < 1
    ):
        problems.append(f"max_response_bytes: must be an int >= 1, got {max_response_bytes!r}")
    statuses = (
        frozenset(reject_statuses) if isinstance(reject_statuses, Collection) else frozenset()
    )
    if not all(isinstance(s, int) and 400 <= s <= 599 for s in statuses):
        problems.append("reject_statuses: must be 4xx/5xx status codes")
    if ssl_context is not None and not isinstance(ssl_context, ssl.SSLContext):
        problems.append("ssl_context: must be an ssl.SSLContext")
    if guard is not None and not isinstance(guard, AddressGuard):
        problems.append("guard: must be an AddressGuard")
    if not isinstance(retry, Retry):
        problems.append("retry: must be a Retry(...)")
    if problems:
        raise JobDeclarationInvalidError(
            f"webhook {name!r} is declared wrong: " + "; ".join(problems),
            job=name,
            problems=problems,
        )
    delivery = Delivery(
        name=name,
        endpoint=endpoint,
        event=event,
        ledger=ledger,
        retry=retry,
        disable_after=disable_after,
        timeout_ms=parse_duration(timeout, field="timeout"),
        reject_statuses=statuses,
        max_response_bytes=max_response_bytes,
        guard=guard or AddressGuard(),
        clock=clock,
        user_agent=user_agent,
        ssl_context=ssl_context,
    )
    handle: JobHandle[Any, None] = job(
        input=input,
        idempotency_key=idempotency_key or _input_key,
        tenant=tenant,
        # The delays come with each failure (see the module docstring): the core adds none.
        retry=dataclasses.replace(retry, jitter=False),
        name=name,
        queue=queue,
        concurrency=concurrency,
        registry=registry,
        declared_at=site,
    )(delivery.body)
    return WebhookJob(handle, delivery)
