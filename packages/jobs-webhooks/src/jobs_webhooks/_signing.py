"""Signatures: the Standard Webhooks scheme both ways, and a plain body HMAC for other vendors.

Standard Webhooks (standardwebhooks.com) signs ``"{webhook-id}.{webhook-timestamp}.{body}"`` with
HMAC-SHA256 under a secret written ``whsec_<base64>``, and sends ``webhook-signature: v1,<base64>``
(one space-separated ``v1,…`` per secret while a secret is rotated). The timestamp is checked
against a tolerance in both directions, so a captured request cannot be replayed later and a
sender's clock running ahead cannot mint signatures for the future. Every comparison is
constant-time (:func:`hmac.compare_digest`).

Rejected: verifying with the ``standardwebhooks`` package at run time. It decodes the body as
UTF-8 before checking it (a vendor's non-UTF-8 body could not verify), fixes the tolerance at five
minutes and reads the wall clock itself; the tests use it as the independent verifier of what we
send.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

from jobs_core._durations import Duration, parse_duration
from jobs_core.errors import WebhookEndpointInvalidError, WebhookSignatureInvalidError

if TYPE_CHECKING:
    from jobs_webhooks._inbound import Inbound, Verified

SECRET_PREFIX = "whsec_"
"""How a Standard Webhooks secret is written: the prefix, then the key's base64."""

MIN_SECRET_BYTES = 16
"""The shortest key accepted (128 bits); a shorter one is refused as a likely mistake."""

DEFAULT_TOLERANCE = "5m"
"""How far a ``webhook-timestamp`` may be from now, either way, before it is refused."""


def secret_key(secret: str) -> bytes:
    """Answer the HMAC key a ``whsec_…`` secret carries.

    Args:
        secret: ``whsec_`` followed by the key in base64 (padding optional).

    Raises:
        WebhookEndpointInvalidError: ``X_WEBHOOK_ENDPOINT_INVALID`` when the prefix is missing,
            the rest is not base64, or the key is shorter than 16 bytes (the secret itself is
            never quoted).
    """
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise WebhookEndpointInvalidError(
            "a webhook secret must be written whsec_<base64>", field="secrets"
        )
    encoded = secret[len(SECRET_PREFIX) :]
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise WebhookEndpointInvalidError(
            "a webhook secret's key after whsec_ is not base64", field="secrets"
        ) from None
    if len(key) < MIN_SECRET_BYTES:
        raise WebhookEndpointInvalidError(
            f"a webhook secret's key must be at least {MIN_SECRET_BYTES} bytes, got {len(key)}",
            field="secrets",
        )
    return key


def _signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> bytes:
    signed = msg_id.encode("utf-8") + b"." + str(timestamp).encode("ascii") + b"." + body
    return hmac.new(key, signed, hashlib.sha256).digest()


def sign_standard_webhook(
    msg_id: str, timestamp: int, body: bytes, secrets: str | Sequence[str]
) -> dict[str, str]:
    """Answer the three Standard Webhooks headers for one send of ``body``.

    Args:
        msg_id: the message id (``webhook-id``), the same on every attempt of one delivery.
        timestamp: the send time in whole seconds since the epoch (``webhook-timestamp``).
        body: the exact bytes that go on the wire.
        secrets: one ``whsec_…`` secret, or several while one is rotated (one signature each,
            in the order given).

    Returns:
        ``{"webhook-id", "webhook-timestamp", "webhook-signature"}``; the signature header is
        ``v1,<base64>`` per secret, space-separated.

    Raises:
        WebhookEndpointInvalidError: ``X_WEBHOOK_ENDPOINT_INVALID`` for no secret or a bad one.
    """
    listed = [secrets] if isinstance(secrets, str) else list(secrets)
    if not listed:
        raise WebhookEndpointInvalidError("an endpoint needs at least one secret", field="secrets")
    signatures = " ".join(
        "v1," + base64.b64encode(_signature(secret_key(s), msg_id, timestamp, body)).decode()
        for s in listed
    )
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signatures,
    }


def verify_standard_webhook(
    inbound: Inbound,
    *,
    secret: str | Sequence[str],
    tolerance: Duration = DEFAULT_TOLERANCE,
    now: Callable[[], float] = time.time,
) -> Verified:
    """Verify a Standard Webhooks request; answer its id and JSON payload.

    The event id is the ``webhook-id`` header, which the signature covers, so a captured request
    replayed under a fresh id does not verify.

    Args:
        inbound: the request as the receiver read it.
        secret: the ``whsec_…`` secret, or several (any one matching verifies: rotation).
        tolerance: how far ``webhook-timestamp`` may be from ``now``, in both directions (5 min).
        now: the clock, seconds since the epoch (tests pass their own).

    Returns:
        ``Verified(event_id=<webhook-id>, payload=<the body parsed as JSON>)``.

    Raises:
        WebhookSignatureInvalidError: ``X_WEBHOOK_SIGNATURE_INVALID`` for a missing header, a
            timestamp outside the tolerance, no matching ``v1`` signature, or a body that is not
            JSON (the receiver answers 401, with no detail).
    """
    from jobs_webhooks._inbound import Verified

    msg_id = inbound.headers.get("webhook-id")
    stamp = inbound.headers.get("webhook-timestamp")
    given = inbound.headers.get("webhook-signature")
    if not msg_id or not stamp or not given:
        raise WebhookSignatureInvalidError("a webhook-id, -timestamp or -signature is missing")
    timestamp = _timestamp(stamp, tolerance, now)
    keys = [secret_key(s) for s in ([secret] if isinstance(secret, str) else secret)]
    candidates = []
    for part in given.split(" "):
        version, _, value = part.partition(",")
        if version != "v1":
            continue
        try:
            candidates.append(base64.b64decode(value, validate=True))
        except (binascii.Error, ValueError):
            continue
    matched = False
    for key in keys:
        expected = _signature(key, msg_id, timestamp, inbound.body)
        for candidate in candidates:
            # Every pair is compared (no early exit), each in constant time.
            matched |= hmac.compare_digest(expected, candidate)
    if not matched:
        raise WebhookSignatureInvalidError("no v1 signature matches")
    try:
        payload = json.loads(inbound.body)
    except ValueError:
        raise WebhookSignatureInvalidError("the signed body is not JSON") from None
    return Verified(event_id=msg_id, payload=payload)


def _timestamp(stamp: str, tolerance: Duration, now: Callable[[], float]) -> int:
    if not stamp.isascii() or not stamp.isdigit() or len(stamp) > 12:
        raise WebhookSignatureInvalidError("webhook-timestamp is not whole seconds")
    timestamp = int(stamp)
    window = parse_duration(tolerance, field="tolerance") / 1000
    if abs(now() - timestamp) > window:
        raise WebhookSignatureInvalidError(
            "webhook-timestamp is outside the tolerance", tolerance_s=window
        )
    return timestamp


def verify_hmac(
    body: bytes,
    secret: str | bytes,
    given: str | None,
    encoding: Literal["hex", "base64"] = "hex",
    *,
    algorithm: Literal["sha256", "sha512", "sha1"] = "sha256",
    prefix: str = "",
    timestamp: int | str | None = None,
    tolerance: Duration = DEFAULT_TOLERANCE,
    now: Callable[[], float] = time.time,
) -> None:
    """Check a vendor's plain HMAC of the body (GitHub's ``sha256=…``, Shopify's base64, …).

    Args:
        body: the exact bytes the vendor signed (for a scheme that signs ``"{t}.{body}"``, pass
            those bytes).
        secret: the shared secret (text is encoded as UTF-8).
        given: the signature header's value (``None`` when the header is missing).
        encoding: how the vendor writes the MAC: ``"hex"`` or ``"base64"``.
        algorithm: the HMAC digest.
        prefix: text the header puts before the MAC (``"sha256="``); required when given.
        timestamp: the vendor's signed timestamp (seconds since the epoch), when its scheme has
            one: then it must lie within ``tolerance`` of ``now``, in both directions.
        tolerance: the window for ``timestamp`` (5 min).
        now: the clock, seconds since the epoch.

    Raises:
        WebhookSignatureInvalidError: ``X_WEBHOOK_SIGNATURE_INVALID`` for a missing or malformed
            header, a timestamp outside the window, or a MAC that does not match (compared in
            constant time).
        ValueError: an ``algorithm`` other than the three named.
    """
    if not given or not given.startswith(prefix):
        raise WebhookSignatureInvalidError("the signature header is missing or malformed")
    if timestamp is not None:
        _timestamp(str(timestamp), tolerance, now)
    key = secret.encode("utf-8") if isinstance(secret, str) else secret
    if algorithm not in ("sha256", "sha512", "sha1"):
        raise ValueError(
            f"verify_hmac: algorithm must be sha256, sha512 or sha1, not {algorithm!r}"
        )
    digest = hmac.new(key, body, algorithm).digest()
    mac = given[len(prefix) :].strip()
    try:
        presented = (
            bytes.fromhex(mac) if encoding == "hex" else base64.b64decode(mac, validate=True)
        )
    except (binascii.Error, ValueError):
        raise WebhookSignatureInvalidError("the signature is not valid " + encoding) from None
    if not hmac.compare_digest(digest, presented):
        raise WebhookSignatureInvalidError("the signature does not match")
