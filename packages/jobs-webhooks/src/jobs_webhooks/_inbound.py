"""Inbound webhooks: :func:`webhook_receiver` acknowledges an event only after its row is written.

The request path reads the exact bytes (at most ``max_bytes``: a ``Content-Length`` over it is
refused before any byte is read, a body that passes it is refused at that chunk, and the rest is
never read), hands them unparsed to the app's ``verify``, and enqueues what ``verify`` answered
with the outbox bypassed: the row is written, not staged behind a commit that might never
happen. Only then does it answer ``200 {"ok": true, "event_id", "deduped"}``. Every failure to
write is a 503 with ``Retry-After``, so the vendor redelivers and nothing acknowledged is lost.

The event id is the job's idempotency key, so a redelivery while the job is live answers
``deduped: true`` and ``handle`` runs once. After the job settles a redelivery runs ``handle``
again: the live window is the dedupe, the app's own table is the seen-set (a seen-set written
before the enqueue would lose the event whenever the enqueue failed).

Rejected: parsing JSON (or requiring a content type) before ``verify``. A schema that answers
first turns a vendor's shape change into a refusal, and a form-encoded or XML vendor could never
reach the signature check.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field, JsonValue
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response as StarletteResponse
from starlette.routing import Route, compile_path

from jobs_core import JobContext, Retry, job
from jobs_core._durations import Duration, duration_problem, parse_duration
from jobs_core.errors import (
    WebhookEventIdInvalidError,
    WebhookReceiverInvalidError,
    WebhookReceiverUnavailableError,
    classification_of,
)
from jobs_core.job import JobHandle, JobRegistry, declaration_site

_log = logging.getLogger("jobs.webhooks")

MAX_BYTES = 1_048_576
"""The default cap on an inbound body (1 MiB)."""

_EVENT_ID = re.compile(r"[\x20-\x7e]{1,256}")


@dataclass(frozen=True, slots=True)
class Response:
    """An HTTP answer, framework-free (:meth:`WebhookReceiver.handle_request` answers one).

    Args:
        status: the status code.
        body: the body bytes.
        headers: extra headers (``content-type`` included when set).
    """

    status: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, status: int, value: Any, headers: Mapping[str, str] | None = None) -> Response:
        """Answer a JSON response of ``value`` with ``status``."""
        return cls(
            status,
            json.dumps(value, separators=(",", ":")).encode(),
            {"content-type": "application/json", **(headers or {})},
        )


@dataclass(frozen=True, slots=True)
class Inbound:
    """One inbound request as ``verify`` sees it: nothing parsed.

    Attributes:
        method: ``"POST"`` (or ``"GET"`` for a handshake).
        path: the request path.
        params: the path's parameters (``/hooks/vendor/{account}`` gives ``account``), as text.
        headers: the headers, looked up case-insensitively (``inbound.headers.get("x-sig")``).
        body: the exact bytes received.
        query: the raw query string.
    """

    method: str
    path: str
    params: Mapping[str, str]
    headers: Headers
    body: bytes
    query: str = ""


@dataclass(frozen=True, slots=True)
class Verified:
    """What ``verify`` answers for a genuine event.

    Args:
        event_id: the vendor's event id, read from the verified bytes (a signed header or the
            signed body): 1 to 256 printable ASCII characters. It is the dedupe key.
        payload: the JSON data the job's ``handle`` receives.
    """

    event_id: str
    payload: JsonValue


@dataclass(frozen=True, slots=True)
class Answer:
    """What ``verify`` answers for a vendor's handshake or challenge: sent as is, nothing queued.

    Args:
        response: the answer.
    """

    response: Response


class InboundEvent(BaseModel):
    """The receiver job's input: one verified event (the payload is stored sensitive)."""

    event_id: str
    payload: JsonValue = Field(json_schema_extra={"sensitive": True})
    params: dict[str, str] = Field(default_factory=dict)


def _problems(
    path: Any, verify: Any, handle: Any, max_bytes: Any, handshake: Any, retry_after: Any
) -> list[str]:
    found: list[str] = []
    if not isinstance(path, str) or not path.startswith("/"):
        found.append("path: must be an absolute path such as '/hooks/vendor/{account}'")
    else:
        try:
            compile_path(path)
        except (ValueError, AssertionError) as exc:
            found.append(f"path: {exc}")
    if not callable(verify):
        found.append("verify: must be a function (inbound) -> Verified | Answer")
    if not callable(handle):
        found.append("handle: must be a function (event_id, payload)")
    else:
        try:
            inspect.signature(handle).bind(None, None)
        except TypeError:
            found.append("handle: must accept two arguments (event_id, payload)")
        except ValueError:
            pass
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        found.append(f"max_bytes: must be an int >= 1, got {max_bytes!r}")
    if handshake is not None and not callable(handshake):
        found.append("handshake: must be a function (inbound) -> Response, or None")
    problem = duration_problem(retry_after)
    if problem is not None:
        found.append(f"retry_after: {problem}")
    return found


async def _answer(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class WebhookReceiver:
    """A declared receiver: its ASGI app, a framework-free entry, and the job behind them.

    Attributes:
        job: the :class:`~jobs_core.JobHandle` whose body is ``handle``.
        path: the path template it serves.
        max_bytes: the body cap.
    """

    def __init__(
        self,
        handle: JobHandle[InboundEvent, Any],
        *,
        path: str,
        verify: Callable[[Inbound], Any],
        handshake: Callable[[Inbound], Any] | None,
        max_bytes: int,
        retry_after_s: int,
    ) -> None:
        self.job = handle
        self.path = path
        self.max_bytes = max_bytes
        self._verify = verify
        self._handshake = handshake
        self._retry_after_s = retry_after_s
        self._regex, _, self._convertors = compile_path(path)

    @property
    def name(self) -> str:
        """The job's durable name."""
        return self.job.name

    def describe(self) -> dict[str, Any]:
        """Answer the job's descriptor with the receiver's own settings."""
        return {
            **self.job.describe(),
            "factory": "webhook_receiver",
            "path": self.path,
            "max_bytes": self.max_bytes,
            "handshake": self._handshake is not None,
        }

    async def receive(self, inbound: Inbound) -> Response:
        """Verify and enqueue one request already read; answer what to send back.

        ``200 {"ok": true, "event_id", "deduped"}`` once the row is written; 401 (no detail)
        when ``verify`` raised; 422 ``X_WEBHOOK_EVENT_ID_INVALID`` for a bad event id, or the
        code of an input no driver stores; 503 + ``Retry-After``
        (``X_WEBHOOK_RECEIVER_UNAVAILABLE``) when the enqueue failed; 413 over ``max_bytes``.
        """
        if len(inbound.body) > self.max_bytes:
            return _too_large()
        try:
            verdict = await _answer(self._verify(inbound))
        except Exception as exc:
            _log.info(
                "jobs.webhook.unverified",
                extra={
                    "event": "jobs.webhook.unverified",
                    "job": self.name,
                    "error": type(exc).__name__,
                },
            )
            return Response.json(401, {"ok": False})
        if isinstance(verdict, Answer):
            return verdict.response
        if not isinstance(verdict, Verified):
            _log.error(
                "jobs.webhook.verify-invalid",
                extra={"event": "jobs.webhook.verify-invalid", "job": self.name},
            )
            return Response.json(500, {"ok": False, "code": WebhookReceiverInvalidError.code})
        event_id = verdict.event_id
        if not isinstance(event_id, str) or not _EVENT_ID.fullmatch(event_id):
            # Never echoed: it came from the sender and failed the shape check.
            return Response.json(422, {"ok": False, "code": WebhookEventIdInvalidError.code})
        try:
            result = await self.job.enqueue(
                InboundEvent(
                    event_id=event_id, payload=verdict.payload, params=dict(inbound.params)
                ),
                outbox=False,
            )
        except Exception as exc:
            code = getattr(exc, "code", None)
            if classification_of(exc) == "terminal":
                # An event no driver can store (U+0000, a tenant refusal): a redelivery could
                # only fail the same way, so no 5xx for the vendor to retry forever.
                return Response.json(422, {"ok": False, "code": code or "X_JOB_INPUT_INVALID"})
            _log.warning(
                "jobs.webhook.receiver-unavailable",
                extra={
                    "event": "jobs.webhook.receiver-unavailable",
                    "job": self.name,
                    "error": type(exc).__name__,
                    "code": code,
                },
            )
            return Response.json(
                503,
                {"ok": False, "code": WebhookReceiverUnavailableError.code},
                {"retry-after": str(self._retry_after_s)},
            )
        return Response.json(200, {"ok": True, "event_id": event_id, "deduped": result.deduped})

    async def handle_request(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str] | Iterable[tuple[str, str]],
        body: bytes,
        query: str = "",
    ) -> Response:
        """Serve one request from any framework (Django, Flask, ...): no ASGI needed.

        Args:
            method: the HTTP method.
            path: the request path, matched against the receiver's template (404 otherwise).
            headers: the request headers (a mapping or ``(name, value)`` pairs).
            body: the body the framework read (cap it there too: over ``max_bytes`` is 413).
            query: the raw query string.

        Returns:
            The :class:`Response` to send: see :meth:`receive`; 404 for another path, 405 for
            another method.
        """
        matched = self._regex.match(path)
        if matched is None:
            return Response.json(404, {"ok": False})
        params = {
            key: str(self._convertors[key].convert(value))
            for key, value in matched.groupdict().items()
        }
        pairs = headers.items() if isinstance(headers, Mapping) else headers
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in pairs]
        inbound = Inbound(method.upper(), path, params, Headers(raw=raw), body, query)
        if inbound.method == "GET" and self._handshake is not None:
            return await self._shake(inbound)
        if inbound.method != "POST":
            return Response.json(405, {"ok": False}, {"allow": self._allowed()})
        return await self.receive(inbound)

    def handle_request_sync(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str] | Iterable[tuple[str, str]],
        body: bytes,
        query: str = "",
    ) -> Response:
        """:meth:`handle_request` for a sync view (Flask, sync Django): runs it to completion.

        The enqueue runs as ``enqueue_sync`` does, so the installed driver must be usable from
        the calling thread (see ``jobs_core``'s sync API).

        Raises:
            RuntimeError: when called on a thread running an event loop (await the async form).
        """
        from jobs_core._current import run_sync

        return run_sync(self.handle_request(method, path, headers, body, query))

    def _allowed(self) -> str:
        return "GET, POST" if self._handshake is not None else "POST"

    async def _shake(self, inbound: Inbound) -> Response:
        assert self._handshake is not None
        answer = await _answer(self._handshake(inbound))
        if isinstance(answer, Response):
            return answer
        return Response.json(500, {"ok": False, "code": WebhookReceiverInvalidError.code})

    def asgi(self) -> Starlette:
        """Answer a Starlette (ASGI) app serving the receiver's path.

        Mount it in FastAPI or Starlette (``app.mount("/", receiver.asgi())``) or serve it alone
        (``uvicorn module:app`` with ``app = receiver.asgi()``). POST feeds :meth:`receive`; GET
        serves the handshake when one was declared.
        """
        routes = [Route(self.path, self._asgi_post, methods=["POST"])]
        if self._handshake is not None:
            routes.append(Route(self.path, self._asgi_get, methods=["GET"]))
        return Starlette(routes=routes)

    def _inbound(self, request: Request, body: bytes) -> Inbound:
        params = {key: str(value) for key, value in request.path_params.items()}
        return Inbound(
            request.method, request.url.path, params, request.headers, body, request.url.query
        )

    async def _asgi_post(self, request: Request) -> StarletteResponse:
        declared = request.headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                return _starlette(Response.json(400, {"ok": False}))
            if int(declared) > self.max_bytes:
                return _starlette(_too_large())
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > self.max_bytes:
                # Answered at once; the rest of the body is never read.
                return _starlette(_too_large())
        return _starlette(await self.receive(self._inbound(request, bytes(body))))

    async def _asgi_get(self, request: Request) -> StarletteResponse:
        return _starlette(await self._shake(self._inbound(request, b"")))


def _too_large() -> Response:
    # Connection: close, so the server drops the connection instead of reading the rest.
    return Response.json(413, {"ok": False}, {"connection": "close"})


def _starlette(response: Response) -> StarletteResponse:
    return StarletteResponse(response.body, response.status, headers=dict(response.headers))


def _body_for(handle: Callable[[str, Any], Any]) -> Callable[..., Awaitable[Any]]:
    """The job body: ``handle(event_id, payload)``, a plain function on a thread of its own."""
    if inspect.iscoroutinefunction(handle):

        async def run_async(input: InboundEvent, step: Any, ctx: JobContext) -> Any:
            return await handle(input.event_id, input.payload)

        return run_async

    async def run_sync(input: InboundEvent, step: Any, ctx: JobContext) -> Any:
        # A lambda that returns a coroutine runs on the thread only up to that coroutine.
        return await _answer(await asyncio.to_thread(handle, input.event_id, input.payload))

    return run_sync


def webhook_receiver(
    *,
    name: str,
    path: str,
    tenant: Callable[[InboundEvent], str] | Literal["none"],
    verify: Callable[[Inbound], Verified | Answer | Awaitable[Verified | Answer]],
    handle: Callable[[str, Any], Any],
    max_bytes: int = MAX_BYTES,
    handshake: Callable[[Inbound], Response | Awaitable[Response]] | None = None,
    retry: Retry | None = None,
    queue: str = "default",
    timeout: Duration | None = None,
    retry_after: Duration = "30s",
    registry: JobRegistry | None = None,
) -> WebhookReceiver:
    """Declare a receiver: an ASGI app that verifies and enqueues, and the job that handles.

    Args:
        name: the job's durable name.
        path: the absolute path template served, e.g. ``"/hooks/vendor/{account}"``.
        tenant: ``(InboundEvent) -> org id`` (``event.params`` holds the path's parameters) or
            ``"none"``.
        verify: ``(Inbound) -> Verified | Answer`` (sync or async) after checking the MAC, e.g.
            ``lambda i: verify_standard_webhook(i, secret=SECRET)``. Raising answers 401.
        handle: ``(event_id, payload)``, the job's body (async, or sync on a worker thread).
        max_bytes: the body cap (1 MiB): more is answered 413 without reading the rest.
        handshake: ``(Inbound) -> Response`` served on GET of the path (subscription checks).
        retry: the job's retry policy (the core's default: 3 attempts).
        queue: the job's queue.
        timeout: the job's whole-attempt deadline.
        retry_after: what a 503's ``Retry-After`` asks the vendor to wait (30 s).
        registry: the job registry to join (default the process-wide one).

    Returns:
        The :class:`WebhookReceiver`; mount ``receiver.asgi()``.

    Raises:
        WebhookReceiverInvalidError: ``X_WEBHOOK_RECEIVER_INVALID`` naming every bad receiver
            field (a bad job field raises the core's own declaration error).
        JobDuplicateError: ``X_JOB_DUPLICATE`` when another job holds ``name``.
    """
    # First: the app's call site tells a reload of this declaration from a second one.
    site = declaration_site()
    problems = _problems(path, verify, handle, max_bytes, handshake, retry_after)
    if problems:
        raise WebhookReceiverInvalidError(
            f"webhook_receiver {name!r} is declared wrong: " + "; ".join(problems),
            job=name,
            problems=problems,
        )
    handle_job: JobHandle[InboundEvent, Any] = job(
        input=InboundEvent,
        idempotency_key=lambda event: event.event_id,
        tenant=tenant,
        retry=retry,
        name=name,
        queue=queue,
        timeout=timeout,
        registry=registry,
        declared_at=site,
    )(_body_for(handle))
    return WebhookReceiver(
        handle_job,
        path=path,
        verify=verify,
        handshake=handshake,
        max_bytes=max_bytes,
        retry_after_s=max(1, parse_duration(retry_after, field="retry_after") // 1000),
    )
