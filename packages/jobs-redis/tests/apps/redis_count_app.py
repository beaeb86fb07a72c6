"""A worker app for the multi-process test: each run counts itself in a Redis hash.

The count lives outside the queue (``{prefix}:effects``, key -> executions), so the test checks
"exactly once" on the effect, not on the driver's own bookkeeping.
"""

from __future__ import annotations

import os
from typing import Any

import redis.asyncio as aioredis
from pydantic import BaseModel

from jobs_core import job

_URL = os.environ["JOBS_TEST_REDIS_URL"]
_EFFECTS = "{" + os.environ["JOBS_TEST_PREFIX"] + "}:effects"
_client: aioredis.Redis | None = None


class Unit(BaseModel):
    n: int


@job(input=Unit, idempotency_key=lambda u: f"u{u.n}", tenant="none", name="count.unit")
async def unit(item: Unit, step: Any, ctx: Any) -> None:
    global _client
    if _client is None:
        _client = aioredis.Redis.from_url(_URL)
    await _client.hincrby(_EFFECTS, f"u{item.n}", 1)
