"""Builders shared by the pg tests (test data goes through the driver, never raw SQL)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any
from uuid import UUID

from jobs_conformance.target import claim as claim
from jobs_conformance.target import request as conformance_request
from jobs_core.types import EnqueueRequest, JobInfo
from jobs_pg import PostgresDriver


def request(key: str = "k", *, name: str = "job", **options: Any) -> EnqueueRequest:
    """The conformance suite's request builder, stamped with this suite's trace and actor."""
    built = conformance_request(key, name=name, **options)
    return replace(built, traceparent="00-trace-span-01", enqueued_by="user-1")


async def info(driver: PostgresDriver, job_id: UUID) -> JobInfo:
    found = await driver.introspect.get(job_id)
    assert found is not None
    return found


async def until(
    check: Callable[[], Awaitable[bool]] | Callable[[], bool],
    timeout: float = 30.0,
    every: float = 0.05,
) -> None:
    """Wait until ``check()`` holds (it may be async); fail with a TimeoutError after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        outcome = check()
        if not isinstance(outcome, bool):
            outcome = await outcome
        if outcome:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s")
        await asyncio.sleep(every)


APPS = Path(__file__).parent / "apps"


class Fleet:
    """Worker subprocesses over one schema, and the executions they recorded."""

    def __init__(self, url: str, logs: Path) -> None:
        self.url = url
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, queue: str, *options: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PG_WORKLOAD_LOG": str(self.logs), "PYTHONPATH": str(APPS)}
        argv = [sys.executable, "-m", "jobs_core.cli", "worker", "pg_workload"]
        argv += ["--driver", self.url, "--queues", queue, "--log-level", "warning", *options]
        out = (self.logs / f"worker{len(self.procs)}.out").open("wb")
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def lines(self, kind: str) -> list[list[str]]:
        found = []
        for path in self.logs.glob("*.log"):
            for line in path.read_text().splitlines():
                fields = line.split()
                if len(fields) > 1 and fields[1] == kind:
                    found.append(fields)
        return found

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
