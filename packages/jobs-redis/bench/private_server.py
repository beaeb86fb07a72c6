"""A private redis-server on a free loopback port, for the jobs-redis bench scripts.

The scripts measure server time (``INFO commandstats``, ``MEMORY USAGE``), so each runs
against a server of its own with no persistence, never the shared one.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time

import redis


def free_port() -> int:
    """Answer a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server() -> tuple[subprocess.Popen[bytes], str, str]:
    """Start a private redis-server without persistence; answer it, its dir and its URL."""
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server is not installed"
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="jobs-redis-bench-")
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    server = subprocess.Popen(
        [*argv, "--appendonly", "no", "--dir", workdir], stdout=subprocess.DEVNULL
    )
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(200):
        try:
            redis.Redis.from_url(url).ping()
            break
        except redis.ConnectionError:
            time.sleep(0.02)
    return server, workdir, url
