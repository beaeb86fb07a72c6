"""What a delivery goes to and what it sends: :class:`Endpoint`, :class:`WebhookEvent`, the body.

An endpoint is checked when it is built (an http(s) URL with a host, ``whsec_`` secrets, header
text that cannot smuggle a line break), so a bad one fails its delivery for good at once
(``X_WEBHOOK_ENDPOINT_INVALID``) instead of being retried.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from jobs_core.errors import WebhookEndpointInvalidError, WebhookEventMissingError
from jobs_core.types import JSONValue
from jobs_webhooks._signing import secret_key


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where one subscriber receives webhooks.

    Args:
        id: the endpoint's id (the ledger's key: failures, disabling).
        url: ``http://`` or ``https://``; its host must resolve to public addresses unless
            ``allow_private``.
        secrets: one ``whsec_<base64>`` secret, or several while rotating: each gets its own
            ``v1,`` signature, so a receiver holding either verifies.
        headers: extra request headers; ours (``webhook-*``, ``content-type``, ``user-agent``)
            win, and framing headers (``host``, ``content-length``, ...) are dropped.
        allow_private: let the host resolve to loopback, private or link-local addresses (a
            trusted internal receiver, tests).

    Raises:
        WebhookEndpointInvalidError: ``X_WEBHOOK_ENDPOINT_INVALID`` for an empty id, a URL that
            is not http(s) with a host, no secret or a malformed one, or non-text headers.
    """

    id: str
    url: str
    secrets: Sequence[str] = field(repr=False)
    headers: Mapping[str, str] = field(default_factory=dict)
    allow_private: bool = False

    def __post_init__(self) -> None:
        secrets = (self.secrets,) if isinstance(self.secrets, str) else tuple(self.secrets)
        object.__setattr__(self, "secrets", secrets)
        object.__setattr__(self, "headers", dict(self.headers))
        if not isinstance(self.id, str) or not self.id or "\x00" in self.id:
            raise WebhookEndpointInvalidError(
                "Endpoint.id must be non-empty text without NUL", field="id"
            )
        target(self.url)
        if not secrets:
            raise WebhookEndpointInvalidError(
                "an endpoint needs at least one secret", field="secrets"
            )
        for secret in secrets:
            secret_key(secret)
        for key, value in self.headers.items():
            if not _header_text(key) or not _header_text(value):
                raise WebhookEndpointInvalidError(
                    "Endpoint.headers must map Latin-1 text without line breaks to the same",
                    field="headers",
                )


def _header_text(value: object) -> bool:
    if not isinstance(value, str) or "\r" in value or "\n" in value or "\x00" in value:
        return False
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class WebhookEvent:
    """What one delivery sends.

    Args:
        id: the message id (``webhook-id``): the same on every attempt, so receivers dedupe on
            it. Use the event's own id.
        topic: the event type, e.g. ``"orders.paid"`` (``webhook-topic``, and ``type`` in the body).
        payload: the JSON data (the body's ``data``).
        occurred_at: when the event happened (aware); the body's ``timestamp`` when given.
    """

    id: str
    topic: str
    payload: JSONValue
    occurred_at: datetime | None = None


def target(url: str) -> httpx.URL:
    """Parse an endpoint URL; answer it if it is ``http(s)`` with a host.

    Raises:
        WebhookEndpointInvalidError: ``X_WEBHOOK_ENDPOINT_INVALID`` otherwise.
    """
    try:
        parsed = httpx.URL(url) if isinstance(url, str) else None
    except httpx.InvalidURL:
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise WebhookEndpointInvalidError(
            "Endpoint.url must be an http:// or https:// URL with a host", field="url"
        )
    return parsed


def shown_url(url: httpx.URL) -> str:
    """Answer ``url`` as a ledger row keeps it: no user info, no query, no fragment."""
    return str(url.copy_with(username=None, password=None, query=None, fragment=None))


def body_bytes(event: WebhookEvent) -> bytes:
    """Answer the JSON body of ``event``: ``{"type", "timestamp", "data"}`` (Standard Webhooks).

    Raises:
        WebhookEventMissingError: ``X_WEBHOOK_EVENT_MISSING`` when the payload has no JSON form.
    """
    document: dict[str, Any] = {"type": event.topic}
    if event.occurred_at is not None:
        document["timestamp"] = event.occurred_at.astimezone(UTC).isoformat().replace("+00:00", "Z")
    document["data"] = event.payload
    try:
        return json.dumps(
            document, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode()
    except (TypeError, ValueError):
        raise WebhookEventMissingError(
            "the event's payload has no JSON form", topic=event.topic
        ) from None
