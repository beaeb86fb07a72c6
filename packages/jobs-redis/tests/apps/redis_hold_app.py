"""A worker app for the lapsed-lease test: one job that holds its slot for a while."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

from jobs_core import job


class Hold(BaseModel):
    n: int
    hold_ms: int


@job(input=Hold, idempotency_key=lambda h: f"h{h.n}", tenant="none", name="hold.sleep")
async def hold(item: Hold, step: Any, ctx: Any) -> None:
    await asyncio.sleep(item.hold_ms / 1000)
