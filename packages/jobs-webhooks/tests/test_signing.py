"""Signatures: ours against the standardwebhooks package, the tolerance both ways, verify_hmac."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from standardwebhooks import Webhook
from starlette.datastructures import Headers

from conftest import new_secret
from jobs_core.errors import WebhookEndpointInvalidError, WebhookSignatureInvalidError
from jobs_webhooks import (
    Inbound,
    Verified,
    sign_standard_webhook,
    verify_hmac,
    verify_standard_webhook,
)


def inbound(headers: dict[str, str], body: bytes) -> Inbound:
    return Inbound("POST", "/hooks", {}, Headers(headers=headers), body)


@given(
    msg_id=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=40),
    payload=st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=12), max_size=4),
)
def test_what_we_sign_the_standardwebhooks_package_verifies(msg_id: str, payload: dict) -> None:
    secret = new_secret()
    body = json.dumps(payload).encode()
    now = int(time.time())
    headers = sign_standard_webhook(msg_id, now, body, [secret])
    assert Webhook(secret).verify(body, headers) == payload


def test_what_the_standardwebhooks_package_signs_we_verify() -> None:
    secret = new_secret()
    body = b'{"type":"user.created","data":{"id":1}}'
    now = datetime.now(UTC)
    signature = Webhook(secret).sign("msg_1", now, body.decode())
    headers = {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signature,
    }
    verified = verify_standard_webhook(inbound(headers, body), secret=secret)
    assert verified == Verified("msg_1", {"type": "user.created", "data": {"id": 1}})


def test_rotation_any_listed_secret_verifies() -> None:
    old, new, other = new_secret(), new_secret(), new_secret()
    body = b'{"a":1}'
    headers = sign_standard_webhook("m", int(time.time()), body, [old, new])
    assert verify_standard_webhook(inbound(headers, body), secret=new).event_id == "m"
    assert verify_standard_webhook(inbound(headers, body), secret=[other, old]).event_id == "m"
    with pytest.raises(WebhookSignatureInvalidError):
        verify_standard_webhook(inbound(headers, body), secret=other)


@pytest.mark.parametrize("skew", [-360, 360])
def test_a_timestamp_six_minutes_off_either_way_is_refused(skew: int) -> None:
    secret = new_secret()
    body = b"{}"
    headers = sign_standard_webhook("m", int(time.time()) + skew, body, secret)
    with pytest.raises(WebhookSignatureInvalidError, match="tolerance"):
        verify_standard_webhook(inbound(headers, body), secret=secret)
    # Inside a wider window it verifies: the signature itself is good.
    assert verify_standard_webhook(inbound(headers, body), secret=secret, tolerance="10m")


@pytest.mark.parametrize(
    "tamper",
    [
        lambda h, b: ({**h, "webhook-id": "other"}, b),
        lambda h, b: (h, b + b" "),
        lambda h, b: ({**h, "webhook-timestamp": str(int(h["webhook-timestamp"]) + 1)}, b),
        lambda h, b: ({**h, "webhook-signature": "v1," + base64.b64encode(b"x" * 32).decode()}, b),
        lambda h, b: ({**h, "webhook-signature": h["webhook-signature"].replace("v1,", "v2,")}, b),
        lambda h, b: ({k: v for k, v in h.items() if k != "webhook-signature"}, b),
        lambda h, b: ({**h, "webhook-timestamp": "12.5"}, b),
    ],
)
def test_forgeries_are_refused(tamper) -> None:  # type: ignore[no-untyped-def]
    secret = new_secret()
    body = b'{"ok":true}'
    headers, forged = tamper(sign_standard_webhook("m", int(time.time()), body, secret), body)
    with pytest.raises(WebhookSignatureInvalidError):
        verify_standard_webhook(inbound(headers, forged), secret=secret)


def test_bad_secrets_are_refused_and_never_quoted() -> None:
    for secret in ("", "abc", "whsec_%%%", "whsec_" + base64.b64encode(b"short").decode()):
        with pytest.raises(WebhookEndpointInvalidError) as caught:
            sign_standard_webhook("m", 1, b"", [secret])
        assert not secret or secret not in str(caught.value)
    with pytest.raises(WebhookEndpointInvalidError):
        sign_standard_webhook("m", 1, b"", [])


def test_verify_hmac_github_and_shopify_styles() -> None:
    body = b"payload=%7B%7D"  # a form body: nothing requires JSON
    hexmac = hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    verify_hmac(body, "s3cret", "sha256=" + hexmac, "hex", prefix="sha256=")
    b64mac = base64.b64encode(hmac.new(b"s3cret", body, hashlib.sha256).digest()).decode()
    verify_hmac(body, b"s3cret", b64mac, "base64")
    for given_value in (None, "", hexmac, "sha256=" + "0" * 64, "sha256=zz"):
        with pytest.raises(WebhookSignatureInvalidError):
            verify_hmac(body, "s3cret", given_value, "hex", prefix="sha256=")


def test_verify_hmac_checks_a_signed_timestamp_both_ways() -> None:
    now = 1_900_000_000
    signed = f"{now}.".encode() + b"{}"
    mac = hmac.new(b"k", signed, hashlib.sha256).hexdigest()
    verify_hmac(signed, "k", mac, timestamp=now, now=lambda: now + 299)
    for moment in (now + 301, now - 301):
        with pytest.raises(WebhookSignatureInvalidError, match="tolerance"):
            verify_hmac(signed, "k", mac, timestamp=now, now=lambda m=moment: m)
