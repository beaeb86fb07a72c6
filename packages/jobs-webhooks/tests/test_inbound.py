"""Inbound webhook_receiver(): under uvicorn on 127.0.0.1, and framework-free."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from conftest import jobs_of, new_secret
from jobs_core import JobRegistry, JobState
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import WebhookReceiverInvalidError
from jobs_core.introspect import get_job
from jobs_core.testing import run_jobs
from jobs_webhooks import (
    Answer,
    Inbound,
    Response,
    Verified,
    WebhookReceiver,
    sign_standard_webhook,
    verify_hmac,
    verify_standard_webhook,
    webhook_receiver,
)
from webhook_servers import Served

MiB = 1_048_576


class Handled:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def __call__(self, event_id: str, payload: Any) -> dict[str, Any]:
        self.calls.append((event_id, payload))
        return {"seen": event_id}


def receiver(
    name: str, registry: JobRegistry, secret: str, handled: Handled, **options: Any
) -> WebhookReceiver:
    return webhook_receiver(
        name=name,
        path="/hooks/vendor/{account}",
        tenant="none",
        verify=lambda inbound: verify_standard_webhook(inbound, secret=secret),
        handle=handled,
        registry=registry,
        **options,
    )


def signed(secret: str, event_id: str, payload: Any, at: float | None = None) -> tuple[dict, bytes]:
    body = json.dumps(payload).encode()
    stamp = int(time.time() if at is None else at)
    return sign_standard_webhook(event_id, stamp, body, secret), body


class Metered:
    """An ASGI wrapper counting the body bytes the app read through ``receive``."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.read = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def counted() -> Any:
            message = await receive()
            self.read += len(message.get("body", b""))
            return message

        await self.app(scope, counted, send)


async def test_a_signed_event_is_acked_after_its_row_and_handled_once_despite_a_replay(
    driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    secret, handled = new_secret(), Handled()
    hooks = receiver(name, registry, secret, handled)
    headers, body = signed(secret, "evt_1", {"type": "invoice.paid", "id": 7})
    async with Served(hooks.asgi()) as server, httpx.AsyncClient(base_url=server.url) as client:
        first = await client.post("/hooks/vendor/acme", content=body, headers=headers)
        replay = await client.post("/hooks/vendor/acme", content=body, headers=headers)
    assert first.status_code == 200
    assert first.json() == {"ok": True, "event_id": "evt_1", "deduped": False}
    assert replay.json() == {"ok": True, "event_id": "evt_1", "deduped": True}
    await run_jobs(driver, registry=registry)
    assert handled.calls == [("evt_1", {"type": "invoice.paid", "id": 7})]
    (row,) = await jobs_of(driver)
    assert row.state == JobState.DONE
    # The stored payload is sensitive: what `jobsctl show` prints masks it.
    shown = await get_job(driver, row.id, registry=registry)
    assert shown.declared and shown.job.input == {
        "event_id": "evt_1",
        "payload": "[redacted]",
        "params": {"account": "acme"},
    }


@pytest.mark.parametrize(
    "case", ["forged", "stale", "future", "no signature", "other secret", "body changed"]
)
async def test_a_request_that_does_not_verify_is_401_with_no_detail(
    case: str, driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    secret = new_secret()
    hooks = receiver(name, registry, secret, Handled())
    at = {"stale": time.time() - 360, "future": time.time() + 360}.get(case)
    headers, body = signed(new_secret() if case == "other secret" else secret, "e", {"a": 1}, at)
    if case == "forged":
        headers["webhook-signature"] = "v1,bm90IGEgc2lnbmF0dXJlIGF0IGFsbCBmb3IgdGhpcw=="
    if case == "no signature":
        del headers["webhook-signature"]
    if case == "body changed":
        body = body.replace(b"1", b"2")
    async with Served(hooks.asgi()) as server, httpx.AsyncClient(base_url=server.url) as client:
        answer = await client.post("/hooks/vendor/acme", content=body, headers=headers)
    assert answer.status_code == 401
    assert answer.json() == {"ok": False}
    assert await jobs_of(driver) == []


async def _raw_post(port: int, headers: dict[str, str], total: int, chunked: bool) -> int:
    """POST ``total`` body bytes while reading the answer; answer its status."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = "POST /hooks/vendor/acme HTTP/1.1\r\nhost: 127.0.0.1\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    head += "transfer-encoding: chunked\r\n" if chunked else f"content-length: {total}\r\n"
    writer.write((head + "\r\n").encode())

    async def pump() -> None:
        piece = b"x" * 65_536
        with_frame = f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece
        try:
            for _ in range(total // len(piece)):
                writer.write(with_frame)
                await writer.drain()
        except ConnectionError:
            pass

    pumping = asyncio.create_task(pump())
    try:
        status_line = await asyncio.wait_for(reader.readline(), 20)
    finally:
        pumping.cancel()
        writer.close()
    return int(status_line.split()[1])


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_10_mb_body_is_refused_413_having_read_at_most_about_1_mib(
    chunked: bool, driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    hooks = receiver(name, registry, new_secret(), Handled(), max_bytes=MiB)
    metered = Metered(hooks.asgi())
    async with Served(metered) as server:
        status = await _raw_post(server.port, {}, 10 * MiB, chunked)
    assert status == 413
    if chunked:
        # Read up to the chunk that passed the cap, never the rest: one ASGI message holds what
        # one socket read gave uvicorn, at most asyncio's 256 KiB.
        assert MiB < metered.read <= MiB + 262_144, metered.read
    else:
        assert metered.read == 0  # Content-Length said so: not one byte read
    assert await jobs_of(driver) == []


async def test_nothing_is_parsed_before_verify_and_no_content_type_is_needed(
    driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    import hashlib
    import hmac

    seen: list[Inbound] = []

    def verify(inbound: Inbound) -> Verified:
        seen.append(inbound)
        verify_hmac(inbound.body, "k", inbound.headers.get("X-Vendor-Sig"), "hex")
        event_id = inbound.body.split(b"&")[0].split(b"=")[1].decode()
        return Verified(event_id, {"size": len(inbound.body)})

    handled = Handled()
    hooks = webhook_receiver(
        name=name,
        path="/hooks/form",
        tenant="none",
        verify=verify,
        handle=handled,
        registry=registry,
    )
    body = b"id=ev9&amount=12&memo=\xff\xfe"  # form-encoded, and not even UTF-8
    mac = hmac.new(b"k", body, hashlib.sha256).hexdigest()
    async with Served(hooks.asgi()) as server, httpx.AsyncClient(base_url=server.url) as client:
        answer = await client.post("/hooks/form", content=body, headers={"x-vendor-sig": mac})
    assert answer.json() == {"ok": True, "event_id": "ev9", "deduped": False}
    assert seen[0].body == body and "content-type" not in seen[0].headers
    await run_jobs(driver, registry=registry)
    assert handled.calls == [("ev9", {"size": len(body)})]


@pytest.mark.parametrize("event_id", ["", "x" * 257, "évènement", "line\nbreak", 42])
async def test_a_bad_event_id_is_422_and_never_echoed(
    event_id: Any, driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    hooks = webhook_receiver(
        name=name,
        path="/in",
        tenant="none",
        verify=lambda inbound: Verified(event_id, {}),
        handle=Handled(),
        registry=registry,
    )
    async with Served(hooks.asgi()) as server, httpx.AsyncClient(base_url=server.url) as client:
        answer = await client.post("/in", content=b"{}")
    assert answer.status_code == 422
    assert answer.json() == {"ok": False, "code": "X_WEBHOOK_EVENT_ID_INVALID"}
    assert await jobs_of(driver) == []


async def test_an_event_no_driver_stores_is_422_with_its_code(
    driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    hooks = webhook_receiver(
        name=name,
        path="/in",
        tenant="none",
        verify=lambda inbound: Verified("e1", {"note": "a\u0000b"}),
        handle=Handled(),
        registry=registry,
    )
    answer = await hooks.handle_request("POST", "/in", {}, b"{}")
    assert answer.status == 422
    assert json.loads(answer.body) == {"ok": False, "code": "X_JOB_INPUT_INVALID"}


async def test_an_answer_is_sent_as_is_and_a_handshake_get_is_served(
    driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    def verify(inbound: Inbound) -> Answer | Verified:
        if inbound.headers.get("x-challenge"):
            return Answer(Response(200, inbound.headers["x-challenge"].encode()))
        return Verified("e", {})

    hooks = webhook_receiver(
        name=name,
        path="/in/{tenant}",
        tenant="none",
        verify=verify,
        handle=Handled(),
        handshake=lambda inbound: Response(200, inbound.query.encode()),
        registry=registry,
    )
    async with Served(hooks.asgi()) as server, httpx.AsyncClient(base_url=server.url) as client:
        challenged = await client.post("/in/t1", content=b"", headers={"x-challenge": "c-123"})
        shake = await client.get("/in/t1?hub.challenge=42")
    assert (challenged.status_code, challenged.text) == (200, "c-123")
    assert (shake.status_code, shake.text) == (200, "hub.challenge=42")
    assert await jobs_of(driver) == []


async def test_handle_request_serves_any_framework(
    driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    secret, handled = new_secret(), Handled()
    hooks = receiver(name, registry, secret, handled, max_bytes=64)
    headers, body = signed(secret, "evt_9", {"n": 1})
    ok = await hooks.handle_request("POST", "/hooks/vendor/acme", list(headers.items()), body)
    assert ok.status == 200 and json.loads(ok.body)["event_id"] == "evt_9"
    assert (await hooks.handle_request("POST", "/elsewhere", headers, body)).status == 404
    wrong = await hooks.handle_request("PUT", "/hooks/vendor/acme", headers, body)
    assert (wrong.status, wrong.headers["allow"]) == (405, "POST")
    big = await hooks.handle_request("POST", "/hooks/vendor/acme", headers, b"x" * 65)
    assert big.status == 413
    await run_jobs(driver, registry=registry)
    assert handled.calls == [("evt_9", {"n": 1})]


def test_handle_request_sync_for_a_sync_view(registry: JobRegistry, name: str) -> None:
    from jobs_core.testing import use_driver

    secret, handled = new_secret(), Handled()
    hooks = receiver(name, registry, secret, handled)
    headers, body = signed(secret, "evt_s", {"n": 2})
    with use_driver(MemoryDriver()) as memory:
        answer = hooks.handle_request_sync("POST", "/hooks/vendor/x", headers, body)
        assert answer.status == 200
        assert asyncio.run(jobs_of(memory))[0].state == JobState.READY


async def test_a_sync_handle_runs_on_a_thread(
    driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    import threading

    threads: list[str] = []

    def handle(event_id: str, payload: Any) -> None:
        threads.append(threading.current_thread().name)

    hooks = webhook_receiver(
        name=name,
        path="/in",
        tenant="none",
        verify=lambda inbound: Verified("e", {}),
        handle=handle,
        registry=registry,
    )
    assert (await hooks.handle_request("POST", "/in", {}, b"")).status == 200
    await run_jobs(driver, registry=registry)
    assert threads and threads[0] != threading.main_thread().name


async def test_the_receiver_mounts_in_fastapi(
    driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    from fastapi import FastAPI

    secret = new_secret()
    hooks = receiver(name, registry, secret, Handled())
    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, bool]:
        return {"ok": True}

    app.mount("/", hooks.asgi())
    headers, body = signed(secret, "evt_f", {"x": 1})
    async with Served(app) as server, httpx.AsyncClient(base_url=server.url) as client:
        assert (await client.get("/health")).json() == {"ok": True}
        answer = await client.post("/hooks/vendor/acme", content=body, headers=headers)
    assert answer.json() == {"ok": True, "event_id": "evt_f", "deduped": False}


def test_declaration_refusals_name_every_bad_field(registry: JobRegistry) -> None:
    with pytest.raises(WebhookReceiverInvalidError) as caught:
        webhook_receiver(
            name="bad",
            path="hooks/no-slash",
            tenant="none",
            verify="not callable",  # type: ignore[arg-type]
            handle=lambda only_one: None,  # type: ignore[arg-type,misc]
            max_bytes=0,
            registry=registry,
        )
    problems = caught.value.meta["problems"]
    assert [p.split(":")[0] for p in problems] == ["path", "verify", "handle", "max_bytes"]
    assert caught.value.code == "X_WEBHOOK_RECEIVER_INVALID"
    assert registry.get("bad") is None


def test_two_receivers_of_one_name_are_a_duplicate(registry: JobRegistry, name: str) -> None:
    from jobs_core.errors import JobDuplicateError

    options: dict[str, Any] = {
        "name": name,
        "path": "/in",
        "tenant": "none",
        "verify": lambda inbound: Verified("e", {}),
        "handle": Handled(),
        "registry": registry,
    }

    def declare() -> WebhookReceiver:
        return webhook_receiver(**options)

    declare()
    declare()  # the same call site again: a reload, not a duplicate
    with pytest.raises(JobDuplicateError):
        webhook_receiver(**options)
