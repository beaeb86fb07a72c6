"""The receiver with its driver's server stopped: 503 + Retry-After, and nothing lost after.

The Redis server here is a private one the test starts on a free port (append-only file on, so
what was acknowledged before the stop survives it) and stops itself; the shared server at 6379 is
never touched.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from conftest import new_secret
from jobs_core import JobRegistry
from jobs_core.testing import run_jobs, use_driver
from jobs_redis import RedisDriver
from jobs_webhooks import sign_standard_webhook, verify_standard_webhook, webhook_receiver
from webhook_servers import Served, free_port


class PrivateRedis:
    """A redis-server of the test's own, persisting to an append-only file in ``workdir``."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None, "redis-server is not installed"
        options = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        options += ["--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.workdir)]
        self.proc = subprocess.Popen(
            [binary, *options],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=self.port, socket_connect_timeout=0.2).ping()
                return
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "the private redis-server did not start"
                time.sleep(0.02)

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.terminate()
        self.proc.wait(10)
        self.proc = None


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    if server.proc is not None:
        server.stop()


async def test_with_the_driver_down_the_answer_is_503_and_nothing_is_lost(
    private_redis: PrivateRedis, registry: JobRegistry, name: str
) -> None:
    secret = new_secret()
    handled: list[tuple[str, Any]] = []
    hooks = webhook_receiver(
        name=name,
        path="/hooks",
        tenant="none",
        verify=lambda inbound: verify_standard_webhook(inbound, secret=secret),
        handle=lambda event_id, payload: handled.append((event_id, payload)),
        retry_after="7s",
        registry=registry,
    )

    def request(event_id: str) -> tuple[dict[str, str], bytes]:
        body = f'{{"id": "{event_id}"}}'.encode()
        return sign_standard_webhook(event_id, int(time.time()), body, secret), body

    driver = RedisDriver(private_redis.url, prefix=name, command_timeout="2s")
    try:
        with use_driver(driver):
            async with (
                Served(hooks.asgi()) as server,
                httpx.AsyncClient(base_url=server.url, timeout=10) as client,
            ):
                headers, body = request("evt_before")
                assert (await client.post("/hooks", content=body, headers=headers)).is_success
                private_redis.stop()
                headers, body = request("evt_during")
                started = time.monotonic()
                down = await client.post("/hooks", content=body, headers=headers)
                assert time.monotonic() - started < 5  # fails fast, never hangs
                assert down.status_code == 503
                assert down.headers["retry-after"] == "7"
                assert down.json() == {"ok": False, "code": "X_WEBHOOK_RECEIVER_UNAVAILABLE"}
                private_redis.start()
                # The vendor redelivers, re-signed at its new send time.
                headers, body = request("evt_during")
                again = await client.post("/hooks", content=body, headers=headers)
                assert again.json() == {"ok": True, "event_id": "evt_during", "deduped": False}
            await run_jobs(driver, registry=registry, timeout="20s")
    finally:
        await driver.close()
    assert sorted(event for event, _ in handled) == ["evt_before", "evt_during"]
