"""Builders shared by the Redis driver's tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from jobs_conformance.target import claim as claim
from jobs_conformance.target import request as conformance_request
from jobs_core.types import EnqueueRequest


def request(key: str = "k", *, name: str = "job", **options: Any) -> EnqueueRequest:
    """The conformance suite's request builder, stamped with this suite's trace and actor."""
    built = conformance_request(key, name=name, **options)
    return replace(built, traceparent="00-trace-span-01", enqueued_by="user-1")


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """Wait until ``check()`` holds, polling every 20 ms; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.02)
