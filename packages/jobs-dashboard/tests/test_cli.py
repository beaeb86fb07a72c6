"""``jobsctl dashboard``: the real command, served by uvicorn in a subprocess."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sys
from subprocess import PIPE

import httpx

from dash_helpers import seed_dead
from jobs_pg import PostgresDriver


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_jobsctl_dashboard_serves_read_only_behind_a_printed_password(
    driver: PostgresDriver, url: str
) -> None:
    [dead] = await seed_dead(driver, 1, "default")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBS_DASHBOARD_")}
    argv = [sys.executable, "-m", "jobs_core", "dashboard", "--driver", url]
    argv += ["--port", str(port), "--read-only", "--app", "dash_jobs", "--log-level", "warning"]
    proc = await asyncio.create_subprocess_exec(
        *argv, stderr=PIPE, env={**env, "PYTHONPATH": os.pathsep.join(sys.path)}
    )
    assert proc.stderr is not None
    try:
        async with asyncio.timeout(60):
            line = (await proc.stderr.readline()).decode()
        found = re.search(
            r"read-only on http://127\.0\.0\.1:(\d+)/ .*user admin, password (\S+)", line
        )
        assert found, line
        base = f"http://127.0.0.1:{found.group(1)}"
        async with httpx.AsyncClient(base_url=base) as client:
            async with asyncio.timeout(30):
                while True:
                    try:
                        page = await client.get(f"/jobs/{dead}", auth=("admin", found.group(2)))
                        break
                    except httpx.ConnectError:
                        await asyncio.sleep(0.1)
            assert page.status_code == 200
            assert "read-only" in page.text and 'method="post"' not in page.text
            assert (await client.get("/")).status_code == 401
            refused = await client.post(f"/jobs/{dead}/retry", auth=("admin", found.group(2)))
            assert refused.status_code == 403
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            rest = (await proc.stderr.read()).decode()
            await proc.wait()
    # uvicorn shuts down cleanly, then re-raises the SIGTERM it caught (its documented way).
    assert proc.returncode in (0, -signal.SIGTERM)
    assert "Traceback" not in rest
