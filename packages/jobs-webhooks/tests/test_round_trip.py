"""Our webhook() delivers to our webhook_receiver() under uvicorn; standardwebhooks agrees."""

from __future__ import annotations

import json
from typing import Any

from standardwebhooks import Webhook

from conftest import new_secret
from jobs_core import JobRegistry, JobState
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.testing import run_jobs
from jobs_webhooks import verify_standard_webhook, webhook_receiver
from webhook_servers import Served
from webhook_world import Delivery, World


class Captured:
    """Keeps the exact bytes and headers of every request on their way to the receiver."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.requests: list[tuple[dict[str, str], bytes]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.requests.append((headers, body))
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


async def test_our_delivery_is_accepted_by_our_receiver_and_by_standardwebhooks(
    world: World, driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    old, new = new_secret(), new_secret()
    handled: list[tuple[str, Any]] = []
    receiver = webhook_receiver(
        name=name + ".in",
        path="/hooks/{source}",
        tenant="none",
        # The receiver holds only the new secret: the rotation's second signature verifies.
        verify=lambda inbound: verify_standard_webhook(inbound, secret=new),
        handle=lambda event_id, payload: handled.append((event_id, payload)),
        registry=registry,
    )
    captured = Captured(receiver.asgi())
    async with Served(captured) as server:
        endpoint = world.add(server.url + "/hooks/shop", secrets=[old, new])
        hook = world.declare(name + ".out", registry)
        sent = await hook.enqueue(Delivery(endpoint_id=endpoint.id, event_id="evt_1"))
        await run_jobs(driver, registry=registry, timeout="20s")
        await hook.aclose()
    delivery = await driver.introspect.get(sent.id)
    assert delivery.state == JobState.DONE
    ((headers, body),) = captured.requests
    document = json.loads(body)
    assert document == {"type": "orders.paid", "data": {"order": 42, "total": "9.90"}}
    # The standardwebhooks package, holding only the second secret, accepts the same request.
    assert Webhook(new).verify(body, headers) == document
    assert Webhook(old).verify(body, headers) == document
    assert handled == [("evt_1", document)]
    (attempt,) = await world.ledger.attempts()
    assert attempt.outcome == "delivered" and attempt.status == 200
    assert json.loads(attempt.excerpt.replace('\\"', '"')) == {
        "ok": True,
        "event_id": "evt_1",
        "deduped": False,
    }
