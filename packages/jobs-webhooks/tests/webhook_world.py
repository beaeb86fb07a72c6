"""The app's side of the delivery tests: an input model, endpoints, events, a ledger."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from conftest import new_secret
from jobs_core import JobRegistry, Retry
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.testing import run_jobs
from jobs_webhooks import Endpoint, WebhookEvent, WebhookJob, memory_webhook_ledger, webhook
from jobs_webhooks._ledger import MemoryWebhookLedger


class Delivery(BaseModel):
    endpoint_id: str
    event_id: str


class World:
    """The app's side of a delivery: its endpoints, its events and its ledger."""

    def __init__(self) -> None:
        self.endpoints: dict[str, Endpoint] = {}
        self.events: dict[str, WebhookEvent] = {
            "evt_1": WebhookEvent("evt_1", "orders.paid", {"order": 42, "total": "9.90"})
        }
        self.ledger: MemoryWebhookLedger = memory_webhook_ledger()
        self.lookups = 0

    def endpoint(self, i: Delivery) -> Endpoint | None:
        self.lookups += 1
        return self.endpoints.get(i.endpoint_id)

    def declare(self, name: str, registry: JobRegistry, **options: Any) -> WebhookJob[Any]:
        options.setdefault("retry", Retry(attempts=1))
        return webhook(
            name=name,
            input=Delivery,
            endpoint=self.endpoint,
            event=lambda i: self.events.get(i.event_id),
            ledger=self.ledger,
            tenant="none",
            registry=registry,
            **options,
        )

    def add(self, url: str, **options: Any) -> Endpoint:
        options.setdefault("secrets", [new_secret()])
        options.setdefault("allow_private", True)
        endpoint = Endpoint(id=f"ep_{len(self.endpoints) + 1}", url=url, **options)
        self.endpoints[endpoint.id] = endpoint
        return endpoint


async def deliver(
    hook: WebhookJob[Any],
    driver: MemoryDriver,
    registry: JobRegistry,
    endpoint: Endpoint,
    event_id: str = "evt_1",
    **run: Any,
) -> Any:
    result = await hook.enqueue(Delivery(endpoint_id=endpoint.id, event_id=event_id))
    run.setdefault("timeout", "20s")
    await run_jobs(driver, registry=registry, **run)
    await hook.aclose()
    return await driver.introspect.get(result.id)


def ran_out(row: Any, code: str) -> bool:
    """Whether ``row`` was buried for running out of attempts, the last one failing with ``code``.

    An exhausted row carries ``X_JOB_MAX_ATTEMPTS``; the last attempt's own code is in its text.
    """
    return bool(row.last_error_code == "X_JOB_MAX_ATTEMPTS" and code in (row.last_error or ""))
