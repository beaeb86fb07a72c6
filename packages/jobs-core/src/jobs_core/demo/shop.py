"""An example shop app: the jobs ``jobsctl demo`` runs, written as an app would write them.

* :func:`checkout` charges the card (undone by a refund if the run fails for good), ships the
  parcel, then pays the vendor at most once. Its tenant is the order's org and its idempotency
  key ``checkout:<order_id>``, so enqueueing the same order twice queues it once.
* :func:`welcome_series` sends a welcome e-mail, sleeps 2 s (the run is parked; no process holds
  it), then sends a nudge.
* :func:`confirm_delivery` asks the customer to confirm a delivery, then waits for the
  ``delivery.confirmed`` event (parked, with a timeout) and closes the order with the answer.
* :data:`stock_sync` is a cron task (``*/2 * * * *`` in Europe/Paris) whose every occurrence
  enqueues one :func:`sync_stock` job.
* :data:`reprice_catalogue` is a backfill: one pass over the catalogue, five products a page,
  each page a durable step, throttled to 20 pages a second; the ledger records the pass, so
  enqueueing it again is a skipped pass.

The outside world is simulated by :data:`SYSTEMS`: every effect (charge, refund, shipment,
payout, e-mail) lands in its ledger, and the warehouse can be told to answer "busy" a number of
times for an order (a transient failure the job retries) or refuses countries it does not ship to
(:class:`UndeliverableError`, classified ``terminal``: retrying cannot help, so the run unwinds at
once).

The one demo-only line in each body is ``steps = narrate(step, ctx)``: it reports what each step
did (ran now, replayed from storage, failed, parked, compensated) to the live log. In an app,
call ``step.run`` / ``step.sleep`` directly.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from jobs_core import (
    BackfillContext,
    Duration,
    JobContext,
    Retry,
    Step,
    backfill,
    classify,
    job,
    task,
)
from jobs_core.steps import StepSuspended
from jobs_core.types import JSONValue

_log = logging.getLogger(__name__)

SHIPS_TO = frozenset({"DE", "FR", "GB", "NL", "US"})
"""Countries the warehouse ships to."""

VENDOR_SHARE = 0.9
"""The share of an order's amount paid out to the vendor."""


class Order(BaseModel):
    """One order to check out.

    Attributes:
        order_id: the shop's order id (the idempotency key is ``checkout:<order_id>``).
        org_id: the org (tenant) the order belongs to.
        amount_cents: what the customer pays, in cents.
        country: where the parcel goes (ISO 3166 alpha-2).
    """

    order_id: str = Field(min_length=1)
    org_id: str = Field(min_length=1)
    amount_cents: int = Field(gt=0)
    country: str = Field(min_length=2, max_length=2)


class Signup(BaseModel):
    """A new user to welcome.

    Attributes:
        email: where the e-mails go (the idempotency key is ``welcome:<email>``).
        org_id: the org (tenant) the user joined.
    """

    email: str = Field(min_length=3)
    org_id: str = Field(min_length=1)


class Delivery(BaseModel):
    """A delivery the customer is asked to confirm.

    Attributes:
        order_id: the order delivered (the idempotency key is ``confirm:<order_id>``).
        org_id: the org (tenant) the order belongs to.
        email: where the request goes.
    """

    order_id: str = Field(min_length=1)
    org_id: str = Field(min_length=1)
    email: str = Field(min_length=3)


class Confirmation(BaseModel):
    """The customer's answer, published as the ``delivery.confirmed`` event.

    Attributes:
        order_id: the order it is about (waits match on it).
        received: whether the parcel arrived.
    """

    order_id: str
    received: bool


class StockSync(BaseModel):
    """One occurrence of the stock sync.

    Attributes:
        at: the occurrence (UTC) the scheduler fired it for; the idempotency key is
            ``stock:<at>``.
    """

    at: datetime


class WarehouseBusyError(Exception):
    """The warehouse API answered 503: transient, so the job retries with backoff."""


class UndeliverableError(Exception):
    """The warehouse does not ship to the order's country: terminal, retrying cannot help."""

    code = "X_SHOP_UNDELIVERABLE"


classify({UndeliverableError.code: "terminal"})


@dataclass(frozen=True, slots=True)
class Effect:
    """One effect an external system performed.

    Attributes:
        system: ``payments``, ``warehouse``, ``vendor`` or ``mail``.
        action: ``charge``, ``refund``, ``ship``, ``payout`` or ``email``.
        ref: the order id or e-mail address it concerns.
        detail: a human summary (amount, template, ...).
        at: when it happened (``time.monotonic()`` seconds).
    """

    system: str
    action: str
    ref: str
    detail: str
    at: float


class ExternalSystems:
    """Stand-ins for the payment provider, the warehouse, vendor payouts and mail.

    Attributes:
        ledger: every effect performed, in order.
        warehouse_calls: how many times the warehouse was asked to ship each order.
        warehouse_busy: how many of its first calls the warehouse answers "busy" per order.
    """

    def __init__(self) -> None:
        self.ledger: list[Effect] = []
        self.warehouse_calls: dict[str, int] = {}
        self.warehouse_busy: dict[str, int] = {}
        self.repriced: dict[str, int] = {}
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Forget every effect, call count, planned failure and repricing."""
        with self._lock:
            self.ledger.clear()
            self.warehouse_calls.clear()
            self.warehouse_busy.clear()
            self.repriced.clear()

    def reprice(self, sku: str) -> None:
        """Count one repricing of ``sku`` (the catalogue backfill's effect)."""
        with self._lock:
            self.repriced[sku] = self.repriced.get(sku, 0) + 1

    def record(self, system: str, action: str, ref: str, detail: str) -> int:
        """Append an effect to the ledger; answer its 1-based position (used as an id)."""
        with self._lock:
            self.ledger.append(Effect(system, action, ref, detail, time.monotonic()))
            return len(self.ledger)

    def call_warehouse(self, order_id: str) -> int:
        """Count one call to the warehouse for ``order_id``; answer the count so far."""
        with self._lock:
            calls = self.warehouse_calls.get(order_id, 0) + 1
            self.warehouse_calls[order_id] = calls
            return calls


SYSTEMS = ExternalSystems()
"""The shop's outside world (one per process)."""


def money(cents: int) -> str:
    """Format cents as dollars, e.g. ``4200`` → ``"$42.00"``."""
    return f"${cents / 100:,.2f}"


async def charge_card(order_id: str, amount_cents: int) -> dict[str, JSONValue]:
    """Charge the customer's card; answer the charge."""
    n = SYSTEMS.record("payments", "charge", order_id, money(amount_cents))
    return {"charge_id": f"ch_{n:03d}", "order_id": order_id, "amount_cents": amount_cents}


async def refund_charge(charge: JSONValue) -> None:
    """Refund a charge answered by :func:`charge_card` (the compensation of ``charge``)."""
    detail = f"{money(charge['amount_cents'])} ({charge['charge_id']})"
    SYSTEMS.record("payments", "refund", charge["order_id"], detail)


async def ship_parcel(order_id: str, country: str) -> dict[str, JSONValue]:
    """Ask the warehouse to ship an order; answer the tracking number.

    Raises:
        WarehouseBusyError: while the warehouse is planned to be busy for this order.
        UndeliverableError: ``X_SHOP_UNDELIVERABLE`` for a country outside :data:`SHIPS_TO`.
    """
    calls = SYSTEMS.call_warehouse(order_id)
    if calls <= SYSTEMS.warehouse_busy.get(order_id, 0):
        raise WarehouseBusyError(f"warehouse API answered 503 Busy (call {calls} for {order_id})")
    if country not in SHIPS_TO:
        raise UndeliverableError(f"the warehouse does not ship to {country}")
    n = SYSTEMS.record("warehouse", "ship", order_id, f"to {country}")
    return {"tracking": f"TRK{n:05d}"}


async def pay_vendor(order_id: str, amount_cents: int) -> dict[str, JSONValue]:
    """Pay the vendor its share of an order; answer the payout."""
    share = round(amount_cents * VENDOR_SHARE)
    n = SYSTEMS.record("vendor", "payout", order_id, money(share))
    return {"payout_id": f"po_{n:03d}", "amount_cents": share}


async def send_email(to: str, template: str) -> dict[str, JSONValue]:
    """Send an e-mail from a template; answer the message id."""
    n = SYSTEMS.record("mail", "email", to, template)
    return {"message_id": f"msg_{n:03d}", "template": template}


class NarratedStep:
    """Demo only: a ``step`` that reports to the live log what each step did.

    It calls the real step runner and logs one structured record per outcome (logger
    ``jobs_core.demo.shop``): ``shop.step.ran`` (the function was called now),
    ``shop.step.replayed`` (its output came from storage and the function was not called),
    ``shop.step.failed``, ``shop.step.parked``, ``shop.step.slept`` and
    ``shop.step.compensated``.
    """

    def __init__(self, step: Step, ctx: JobContext) -> None:
        self._step = step
        self._ctx = ctx

    async def run(
        self,
        name: str,
        fn: Callable[..., Awaitable[JSONValue]],
        *args: Any,
        compensate: Callable[[JSONValue], Awaitable[None]] | None = None,
        once: bool = False,
    ) -> JSONValue:
        """Run ``step.run(name, fn, *args, ...)`` and log whether ``fn`` ran or was replayed.

        Raises:
            Exception: whatever ``step.run`` raised (logged as ``shop.step.failed`` first).
        """
        ran = False

        async def call(*call_args: Any) -> JSONValue:
            nonlocal ran
            ran = True
            return await fn(*call_args)

        undo = None if compensate is None else self._undo(name, compensate)
        try:
            output = await self._step.run(name, call, *args, compensate=undo, once=once)
        except Exception as exc:
            self._tell("shop.step.failed", name, error=str(exc))
            raise
        flags = {"once": True} if once else {}
        self._tell("shop.step.ran" if ran else "shop.step.replayed", name, output=output, **flags)
        return output

    async def sleep(self, duration: Duration) -> None:
        """Run ``step.sleep(duration)`` and log whether it parked the run or is over."""
        try:
            await self._step.sleep(duration)
        except StepSuspended as parked:
            self._tell("shop.step.parked", f"sleep {duration}", wake_at=parked.wake_at.isoformat())
            raise
        self._tell("shop.step.slept", f"sleep {duration}")

    async def wait_for_event(self, name: str, event: str, **options: Any) -> Any:
        """Run ``step.wait_for_event(...)`` and log whether it parked the run or got an answer."""
        try:
            answer = await self._step.wait_for_event(name, event, **options)
        except StepSuspended as parked:
            self._tell("shop.step.waiting", name, on=event, until=parked.wake_at.isoformat())
            raise
        self._tell("shop.step.answered", name, on=event, answer=_as_json(answer))
        return answer

    def _undo(
        self, name: str, compensate: Callable[[JSONValue], Awaitable[None]]
    ) -> Callable[[JSONValue], Awaitable[None]]:
        async def undo(output: JSONValue) -> None:
            try:
                await compensate(output)
            except Exception as exc:
                self._tell("shop.step.failed", f"compensate:{name}", error=str(exc))
                raise
            self._tell("shop.step.compensated", f"compensate:{name}", undo=compensate.__name__)

        return undo

    def _tell(self, event: str, step: str, **fields: Any) -> None:
        ctx = self._ctx
        _log.info(
            event,
            extra={
                "event": event,
                "job": ctx.name,
                "job_id": str(ctx.job_id),
                "attempt": ctx.attempt,
                "step": step,
                **fields,
            },
        )


def _as_json(value: Any) -> JSONValue:
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


def narrate(step: Step, ctx: JobContext) -> NarratedStep:
    """Demo only: wrap a body's ``step`` so the live log tells what each step did."""
    return NarratedStep(step, ctx)


@job(
    input=Order,
    name="shop.checkout",
    queue="orders",
    idempotency_key=lambda order: f"checkout:{order.order_id}",
    tenant=lambda order: order.org_id,
    retry=Retry(attempts=3, backoff="fixed", delay="200ms"),
    compensates=True,
)
async def checkout(order: Order, step: Step, ctx: JobContext) -> dict[str, JSONValue]:
    """Charge, ship, pay the vendor; refund the charge if the run fails for good.

    A retry replays ``charge`` from storage (the card is charged once); ``payout`` is at most
    once: ``started`` is persisted before the vendor is paid.
    """
    steps = narrate(step, ctx)
    charge = await steps.run(
        "charge", charge_card, order.order_id, order.amount_cents, compensate=refund_charge
    )
    parcel = await steps.run("ship", ship_parcel, order.order_id, order.country)
    payout = await steps.run("payout", pay_vendor, order.order_id, order.amount_cents, once=True)
    return {
        "charge_id": charge["charge_id"],
        "tracking": parcel["tracking"],
        "payout_id": payout["payout_id"],
    }


@job(
    input=Signup,
    name="shop.welcome_series",
    queue="emails",
    idempotency_key=lambda signup: f"welcome:{signup.email}",
    tenant=lambda signup: signup.org_id,
    retry=Retry(attempts=3, delay="200ms"),
)
async def welcome_series(signup: Signup, step: Step, ctx: JobContext) -> None:
    """Send a welcome e-mail, wait 2 s without holding a process, then send a nudge."""
    steps = narrate(step, ctx)
    await steps.run("welcome-email", send_email, signup.email, "welcome")
    await steps.sleep("2s")
    await steps.run("nudge-email", send_email, signup.email, "nudge")


@job(
    input=Delivery,
    name="shop.confirm_delivery",
    queue="orders",
    idempotency_key=lambda delivery: f"confirm:{delivery.order_id}",
    tenant=lambda delivery: delivery.org_id,
    event_poll="1s",
)
async def confirm_delivery(delivery: Delivery, step: Step, ctx: JobContext) -> JSONValue:
    """Ask the customer to confirm, wait for their answer (10 s at most), then close the order."""
    steps = narrate(step, ctx)
    await steps.run("ask", send_email, delivery.email, "confirm-delivery")
    answer = await steps.wait_for_event(
        "customer-answer",
        "delivery.confirmed",
        schema=Confirmation,
        match={"order_id": delivery.order_id},
        timeout="10s",
    )
    received = answer is not None and answer.received
    await steps.run("close", close_order, delivery.order_id, received)
    return {"received": received}


async def close_order(order_id: str, received: bool) -> dict[str, JSONValue]:
    """Record the order as closed (``received`` or not) in the shop's books."""
    n = SYSTEMS.record("books", "close", order_id, "received" if received else "no answer")
    return {"closed": n}


@job(
    input=StockSync,
    name="shop.sync_stock",
    queue="orders",
    idempotency_key=lambda sync: f"stock:{sync.at.isoformat()}",
    tenant="none",
)
async def sync_stock(sync: StockSync, step: Step, ctx: JobContext) -> None:
    """Pull stock levels from the warehouse for one occurrence of the task."""
    await narrate(step, ctx).run("pull", pull_stock, sync.at.isoformat())


async def pull_stock(at: str) -> dict[str, JSONValue]:
    """Read the warehouse's stock levels (the effect counted per occurrence)."""
    n = SYSTEMS.record("warehouse", "stock", at, "levels pulled")
    return {"sync": n}


stock_sync = task(
    cron="*/2 * * * *",
    tz="Europe/Paris",
    name="shop.stock_sync",
    enqueue=lambda occurrence: [(sync_stock, StockSync(at=occurrence))],
)
"""Every two minutes, Paris time: one :func:`sync_stock` job per occurrence."""


CATALOGUE = tuple(f"SKU-{n:03d}" for n in range(1, 41))
"""The shop's products, in key order."""

CATALOGUE_PAGE = 5
"""Products per page of the catalogue backfill."""


def catalogue_page(cursor: JSONValue, cancel: Any, input: Any) -> tuple[list[str], int | None]:
    """Answer the page of products after ``cursor`` (an index) and the next cursor."""
    start = int(cursor or 0)
    end = start + CATALOGUE_PAGE
    return list(CATALOGUE[start:end]), (end if end < len(CATALOGUE) else None)


async def reprice(skus: list[str], cancel: Any) -> None:
    """Reprice one page of products (idempotent per product in a real shop)."""
    for sku in skus:
        SYSTEMS.reprice(sku)


def products_left(ctx: BackfillContext) -> int:
    """Products not repriced yet: the pass's total, and zero once it is done."""
    return sum(1 for sku in CATALOGUE if sku not in SYSTEMS.repriced)


reprice_catalogue = backfill(
    name="shop.reprice_catalogue",
    tenant="none",
    pages=catalogue_page,
    handle=reprice,
    count=products_left,
    rate=20,
    queue="maintenance",
)
"""One pass over the catalogue, a step per page of five, at most 20 pages a second."""
