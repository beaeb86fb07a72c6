"""jobs-webhooks: webhooks as jobs, both ways.

Outbound, :func:`webhook` declares a job that delivers one event to one endpoint in the Standard
Webhooks format (signed per attempt, SSRF-guarded, ``Retry-After`` honoured, a ledger row per
attempt, endpoints disabled after repeated failures). Inbound, :func:`webhook_receiver` declares a
job plus an ASGI app (or a framework-free entry) that verifies a request and acknowledges it only
once its job row is written.

:class:`PostgresWebhookLedger` needs psycopg (``pip install "jobs-webhooks[pg]"``); it is imported
on first use, so the rest works without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobs_core.errors import (
    WebhookDeliveryFailedError,
    WebhookDeliveryRejectedError,
    WebhookDeliveryThrottledError,
    WebhookEndpointDisabledError,
    WebhookEndpointInvalidError,
    WebhookEventIdInvalidError,
    WebhookEventMissingError,
    WebhookReceiverInvalidError,
    WebhookReceiverUnavailableError,
    WebhookSignatureInvalidError,
)
from jobs_webhooks._endpoint import Endpoint, WebhookEvent
from jobs_webhooks._inbound import (
    MAX_BYTES,
    Answer,
    Inbound,
    InboundEvent,
    Response,
    Verified,
    WebhookReceiver,
    webhook_receiver,
)
from jobs_webhooks._ledger import (
    EXCERPT_CHARS,
    DeliveryAttempt,
    EndpointHealth,
    MemoryWebhookLedger,
    WebhookLedger,
    memory_webhook_ledger,
)
from jobs_webhooks._outbound import DEFAULT_RETRY, MAX_RESPONSE_BYTES, WebhookJob, webhook
from jobs_webhooks._signing import sign_standard_webhook, verify_hmac, verify_standard_webhook
from jobs_webhooks._ssrf import AddressGuard, blocked_reason, system_resolve

if TYPE_CHECKING:
    from jobs_webhooks._ledger_pg import PostgresWebhookLedger

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """Import :class:`PostgresWebhookLedger` on first use (it needs psycopg)."""
    if name == "PostgresWebhookLedger":
        try:
            from jobs_webhooks._ledger_pg import PostgresWebhookLedger
        except ImportError as exc:
            raise ImportError(
                "PostgresWebhookLedger needs psycopg: pip install 'jobs-webhooks[pg]'"
            ) from exc
        return PostgresWebhookLedger
    raise AttributeError(f"module 'jobs_webhooks' has no attribute {name!r}")


__all__ = [
    "DEFAULT_RETRY",
    "EXCERPT_CHARS",
    "MAX_BYTES",
    "MAX_RESPONSE_BYTES",
    "AddressGuard",
    "Answer",
    "DeliveryAttempt",
    "Endpoint",
    "EndpointHealth",
    "Inbound",
    "InboundEvent",
    "MemoryWebhookLedger",
    "PostgresWebhookLedger",
    "Response",
    "Verified",
    "WebhookDeliveryFailedError",
    "WebhookDeliveryRejectedError",
    "WebhookDeliveryThrottledError",
    "WebhookEndpointDisabledError",
    "WebhookEndpointInvalidError",
    "WebhookEvent",
    "WebhookEventIdInvalidError",
    "WebhookEventMissingError",
    "WebhookJob",
    "WebhookLedger",
    "WebhookReceiver",
    "WebhookReceiverInvalidError",
    "WebhookReceiverUnavailableError",
    "WebhookSignatureInvalidError",
    "blocked_reason",
    "memory_webhook_ledger",
    "sign_standard_webhook",
    "system_resolve",
    "verify_hmac",
    "verify_standard_webhook",
    "webhook",
    "webhook_receiver",
]
