"""Fixtures for the Redis driver's tests, and the conformance suite's opt-in.

Every test runs against the real server at 127.0.0.1:6379 under a random prefix of its own, whose
keys are deleted afterwards. The server being down FAILS the tests: a driver test that skips
when its backend is missing proves nothing. Outage tests start and stop throwaway servers of
their own on other ports (:class:`Throwaway`); the shared server is never stopped.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import redis

from jobs_redis import RedisDriver, is_cluster_url

pytest_plugins = ["jobs_conformance.plugin"]

# A ``redis+cluster://`` URL runs the same tests on a Redis Cluster (``nox -s cluster-redis``).
REDIS_URL = os.environ.get("JOBS_REDIS_URL", "redis://127.0.0.1:6379/0")
HERE = Path(__file__).parent
# --import-mode=importlib puts no test directory on sys.path; the shared builders live here.
sys.path.insert(0, str(HERE))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every test collected under this directory needs the server, the conformance suite's
    # modules (which live in the jobs-conformance package) included.
    for item in items:
        if any(getattr(node, "path", None) == HERE for node in item.listchain()):
            item.add_marker(pytest.mark.redis)


def sync_client(url: str, **options: object) -> redis.Redis | redis.RedisCluster:
    """A blocking client for ``url``: a ``RedisCluster`` for a ``redis+cluster://`` URL."""
    if is_cluster_url(url):
        scheme, sep, rest = url.partition("://")
        return redis.RedisCluster.from_url(scheme.removesuffix("+cluster") + sep + rest, **options)
    return redis.Redis.from_url(url, **options)


@pytest.fixture(scope="session")
def redis_url() -> str:
    try:
        sync_client(REDIS_URL, socket_connect_timeout=1).ping()
    except redis.RedisError as exc:
        pytest.fail(f"the Redis server at {REDIS_URL} does not answer ({exc}): start it", False)
    return REDIS_URL


def drop_prefix(url: str, prefix: str) -> None:
    client = sync_client(url)
    # One prefix is one hash tag, so on a cluster its keys are all on one master.
    keys = list(client.scan_iter(match="{" + prefix + "}:*", count=1000))
    for i in range(0, len(keys), 1000):
        client.delete(*keys[i : i + 1000])
    client.close()


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:12]}"
    yield name
    drop_prefix(redis_url, name)


@pytest.fixture
async def driver(redis_url: str, prefix: str) -> AsyncIterator[RedisDriver]:
    opened = await RedisDriver.connect(redis_url, prefix=prefix)
    yield opened
    await opened.close()


@pytest.fixture
def driver_factory(redis_url: str, prefix: str) -> Callable[[], Awaitable[RedisDriver]]:
    """The conformance suite's driver: one fresh prefix per test, a new client per call."""

    async def open_driver() -> RedisDriver:
        return RedisDriver(redis_url, prefix=prefix)

    return open_driver


@pytest.fixture
def crash_worker_command(redis_url: str, prefix: str) -> Callable[[str], list[str]]:
    """A real worker subprocess on this test's prefix, so crash-proof kills are SIGKILLs."""

    def command(app: str) -> list[str]:
        url = f"{redis_url}?prefix={prefix}"
        return [sys.executable, "-m", "jobs_core.cli", "worker", app, "--driver", url]

    return command


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Throwaway:
    """A redis-server of the test's own on a free port, with no persistence.

    Started and stopped by the test, so an outage can be real without touching the shared
    server other tests use.
    """

    def __init__(self, *extra: str, workdir: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.extra = extra or ("--appendonly", "no")
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None, "redis-server is not installed"
        where = ("--dir", str(self.workdir)) if self.workdir is not None else ()
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                *where,
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=self.port, socket_connect_timeout=0.2).ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def stop(self) -> None:
        """SIGKILL the server: no shutdown save, as a crash or a pulled plug."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)
        self.proc = None


@pytest.fixture
def throwaway() -> Iterator[Throwaway]:
    server = Throwaway()
    server.start()
    yield server
    if server.proc is not None:
        server.stop()
