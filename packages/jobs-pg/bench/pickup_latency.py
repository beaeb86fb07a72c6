"""Pickup latency: another process's enqueue to the body starting, on an idle pg worker.

Usage (from the repository root, PostgreSQL at ``JOBS_PG_URL``)::

    python packages/jobs-pg/bench/pickup_latency.py [--runs 50] [--gap-ms 300]

A ``jobsctl worker`` subprocess (default options: 8 slots, 250 ms poll backing off to 2 s) serves
a fresh schema; this process enqueues one probe every ``--gap-ms`` and the body records how long
after the enqueue began it started. The wake-up path (NOTIFY inside the enqueue statement, the
worker's LISTEN connection) is what is measured: the worker is idle between probes. A gap under
250 ms puts two probes in one wake slot; the second still notifies, because the worker re-armed
the queue's wake when its claim found the queue empty (migration 0002): ``--gap-ms 200`` shows it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

from jobs_core import use_driver
from jobs_pg import PostgresDriver

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import latency_app  # noqa: E402 - the app module the worker subprocess imports too

URL = os.environ.get("JOBS_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _wait_for_lines(log: Path, lines: int) -> None:
    while len(log.read_text().splitlines()) < lines:
        time.sleep(0.05)


async def measure(runs: int, gap_ms: int) -> list[float]:
    """Run ``runs`` probes ``gap_ms`` apart against a fresh schema; answer latencies (ms)."""
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    log = Path(tempfile.mkdtemp()) / "latency.log"
    log.touch()
    driver = await PostgresDriver.connect(URL, schema=schema)
    await driver.migrate()
    env = {**os.environ, "PYTHONPATH": str(HERE), "PG_LATENCY_LOG": str(log)}
    argv = [sys.executable, "-m", "jobs_core.cli", "worker", "latency_app"]
    argv += ["--driver", f"{URL}?schema={schema}", "--log-level", "warning"]
    worker = await asyncio.to_thread(subprocess.Popen, argv, env=env)
    try:
        with use_driver(driver):
            # Warm-up: the worker has started, dialled LISTEN and proven it.
            await latency_app.probe.enqueue(latency_app.Probe(n=-1, stamped=time.time()))
            await asyncio.to_thread(_wait_for_lines, log, 1)
            await asyncio.sleep(1)
            for n in range(runs):
                await latency_app.probe.enqueue(latency_app.Probe(n=n, stamped=time.time()))
                await asyncio.sleep(gap_ms / 1000)
            await asyncio.to_thread(_wait_for_lines, log, runs + 1)
    finally:
        worker.terminate()
        worker.wait(30)
        await driver.close()
        with psycopg.connect(URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')  # type: ignore[arg-type]
    return [
        float(fields[1])
        for fields in (line.split() for line in log.read_text().splitlines())
        if fields[0] != "-1"
    ]


def main() -> None:
    """Parse the options, measure, print the median and p95."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--gap-ms", type=int, default=300)
    args = parser.parse_args()
    latencies = asyncio.run(measure(args.runs, args.gap_ms))
    ordered = sorted(latencies)
    p95 = ordered[max(0, round(0.95 * len(ordered)) - 1)]
    print(
        f"pickup latency over {len(ordered)} probes {args.gap_ms} ms apart: "
        f"median {statistics.median(ordered):.2f} ms, p95 {p95:.2f} ms, "
        f"min {ordered[0]:.2f} ms, max {ordered[-1]:.2f} ms"
    )


if __name__ == "__main__":
    main()
