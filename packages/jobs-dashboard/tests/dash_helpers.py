"""Helpers shared by the dashboard tests: the server, sign-in, seeding and page reading."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from uuid import UUID

import dash_jobs
import uvicorn

from jobs_core import use_driver
from jobs_core.driver import JobDriver
from jobs_core.testing import run_jobs
from jobs_dashboard import basic_auth

USER, PASSWORD = "ops", "correct horse battery"
AUTH = basic_auth(USER, PASSWORD)
CREDENTIALS = (USER, PASSWORD)


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port in this loop; answer its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # A browser tab's connection mid-poll must not hold the shutdown: 2 s, then it is cut.
    config = uvicorn.Config(app, lifespan="off", log_level="warning", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(20):
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError("uvicorn stopped before it started")
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        # uvicorn bounds its own shutdown (above); this bounds the wait on it all the same.
        try:
            async with asyncio.timeout(20):
                await task
        finally:
            sock.close()


async def seed_dead(driver: JobDriver, n: int, queue: str, first: int = 0) -> list[UUID]:
    """Make ``n`` dead jobs in ``queue`` by running a job that always fails (one attempt)."""
    inputs = [dash_jobs.N(n=first + i) for i in range(n)]
    with use_driver(driver):
        results = await dash_jobs.flaky.enqueue_many(inputs, queue=queue)
    await run_jobs(driver, queues=[queue], concurrency=16)
    return [r.id for r in results]


def csrf_of(html: str) -> str:
    """Answer the CSRF token a served page embeds in its forms."""
    found = re.search(r'name="csrf" (?:value|content)="([0-9a-f]+)"', html)
    assert found, "the page carries no CSRF token"
    return found.group(1)
