"""The jobs the dashboard's tests seed: a saga that unwinds, a once step, failures, a task."""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import BaseModel, Field, SecretStr

from jobs_core import JobContext, Retry, Step, job, task

EFFECTS: Counter[str] = Counter()
"""How often each side effect ran in this process."""

SECRET = "s3cr3t-card-4242"
NOTE = "private-note-7788"
PASSWORD = "hunter2-pw-5511"


class Checkout(BaseModel):
    order_id: str
    card_token: SecretStr
    note: str = Field(default="", json_schema_extra={"sensitive": True})
    password: str = ""
    visible: str = "shown-to-operators"


class Order(BaseModel):
    order_id: str


class N(BaseModel):
    n: int


async def reserve(order_id: str) -> dict[str, Any]:
    EFFECTS["reserve"] += 1
    return {"reservation": f"r-{order_id}", "password": PASSWORD}


async def release(output: Any) -> None:
    EFFECTS["release"] += 1


async def charge(order_id: str) -> dict[str, str]:
    EFFECTS["charge"] += 1
    return {"charge": f"ch-{order_id}"}


async def refund(output: Any) -> None:
    EFFECTS["refund"] += 1


async def ship(order_id: str) -> None:
    raise RuntimeError("the carrier refused the parcel")


@job(
    input=Checkout,
    idempotency_key=lambda i: i.order_id,
    tenant="none",
    name="dash.checkout",
    compensates=True,
    retry=Retry(attempts=1),
)
async def checkout(input: Checkout, step: Step, ctx: JobContext) -> None:
    await step.run("reserve", reserve, input.order_id, compensate=release)
    await step.run("charge", charge, input.order_id, compensate=refund)
    await step.run("ship", ship, input.order_id)


@job(
    input=Order,
    idempotency_key=lambda i: i.order_id,
    tenant="none",
    name="dash.pay",
    retry=Retry(attempts=3, delay="20ms", jitter=False),
)
async def pay(input: Order, step: Step, ctx: JobContext) -> dict[str, Any]:
    charged = await step.run("charge", charge, input.order_id, once=True)
    receipt = await step.run("receipt", lambda: {"receipt": f"rc-{input.order_id}"})
    return {"charged": charged, **receipt}


@job(
    input=N,
    idempotency_key=lambda i: str(i.n),
    tenant="none",
    name="dash.flaky",
    retry=Retry(attempts=1),
)
async def flaky(input: N, step: Step, ctx: JobContext) -> None:
    raise ValueError(f"flaky #{input.n} failed")


@job(
    input=N,
    idempotency_key=lambda i: str(i.n),
    tenant="none",
    name="dash.xss",
    retry=Retry(attempts=1),
)
async def xss(input: N, step: Step, ctx: JobContext) -> None:
    raise ValueError("<script>window.__xss = 1</script><img src=x onerror=alert(1)>")


@job(input=N, idempotency_key=lambda i: str(i.n), tenant="none", name="dash.noop")
async def noop(input: N, step: Step, ctx: JobContext) -> dict[str, int]:
    ctx.progress(1, 1, "all done")
    return {"n": input.n}


tick = task(
    cron="*/5 * * * *",
    tz="Europe/Paris",
    name="dash.tick",
    enqueue=lambda occurrence: [(noop, N(n=int(occurrence.timestamp())))],
)
