"""Fixtures: an S3-compatible server over real HTTP, PostgreSQL schemas, a memory driver.

S3 is moto in server mode (``python -m moto.server``), a subprocess the session starts on a free
127.0.0.1 port and stops at the end; boto3 reaches it over HTTP exactly as it reaches S3 (nothing
in the test process is patched). A server that does not come up FAILS the session: these tests
never skip. The SIGKILL test runs real workers on PostgreSQL at ``JOBS_PG_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``) in a schema of its own, dropped afterwards.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from jobs_core import JobRegistry, use_driver
from jobs_core.drivers.memory import MemoryDriver

# Test modules import ie_helpers, and the kill test's worker app ie_kill_app (names unique
# across packages: several packages' tests share one session).
APPS = Path(__file__).parent / "apps"
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(APPS))

PG_URL = os.environ.get("JOBS_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")

S3_CREDENTIALS = {
    "aws_access_key_id": "testing",
    "aws_secret_access_key": "testing",
    "region_name": "us-east-1",
}
"""What the clients under test sign with (moto accepts any credentials)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a moto S3 server started for this session on a free loopback port."""
    log_path = tmp_path_factory.mktemp("moto") / "server.log"
    for _ in range(3):
        port = _free_port()
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while proc.poll() is None and not _answers(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is None and _answers(port):
            break
        proc.kill()
        proc.wait()
    else:
        pytest.fail(f"the moto S3 server did not start: {log_path.read_text()[-2000:]}")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def s3_options(s3_endpoint: str) -> dict[str, Any]:
    """The keyword arguments ``s3_source``/``s3_sink`` take to reach the test server."""
    return {"endpoint_url": s3_endpoint, **S3_CREDENTIALS}


@pytest.fixture
def bucket(s3_options: dict[str, Any]) -> str:
    """A fresh, empty bucket on the test server."""
    import boto3

    name = f"t-{uuid.uuid4().hex[:20]}"
    boto3.session.Session().client("s3", **s3_options).create_bucket(Bucket=name)
    return name


@pytest.fixture
def registry() -> JobRegistry:
    """A job registry of this test's own, so declarations never collide across tests."""
    return JobRegistry()


@pytest.fixture
async def driver() -> AsyncIterator[MemoryDriver]:
    """A memory driver installed for the test."""
    memory = MemoryDriver()
    with use_driver(memory):
        yield memory
    await memory.close()


@pytest.fixture(scope="session")
def pg_url() -> str:
    """The PostgreSQL server's URL; the session fails when it does not answer."""
    import psycopg

    try:
        with psycopg.connect(PG_URL, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL at {PG_URL} does not answer ({exc}); start it (.ci/run does)")
    return PG_URL


@pytest.fixture
def pg_schema(pg_url: str) -> Iterator[str]:
    """A schema name of this test's own, dropped (with everything in it) afterwards."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:16]}"
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
