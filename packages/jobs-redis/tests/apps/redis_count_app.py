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
from jobs_redis import open_client
from jobs_redis._connection import prepare

_URL = os.environ["JOBS_TEST_REDIS_URL"]
_EFFECTS = "{" + os.environ["JOBS_TEST_PREFIX"] + "}:effects"
_client: aioredis.Redis | aioredis.RedisCluster | None = None


class Unit(BaseModel):
    n: int


@job(input=Unit, idempotency_key=lambda u: f"u{u.n}", tenant="none", name="count.unit")
async def unit(item: Unit, step: Any, ctx: Any) -> None:
    global _client
    if _client is None:
        _client = open_client(_URL)
    # A cluster client's slot map first: redis-py 8.1's RedisCluster, given many first commands
    # at once before it has one, fails some with "Connection closed by server".
    await prepare(_client)
    await _client.hincrby(_EFFECTS, f"u{item.n}", 1)
