"""The shop's jobs, found by jobs_pg.django's autodiscovery (no import of it anywhere else)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from jobs_core import job


class Ship(BaseModel):
    order_id: int


@job(input=Ship, idempotency_key=lambda s: f"ship:{s.order_id}", tenant="none", name="shop.ship")
def ship(input: Ship, step: Any, ctx: Any) -> None:
    from shop.models import Order

    Order.objects.filter(id=input.order_id).update(shipped=True)
