"""Redis Cluster vs one Redis, same run: ``python -m bench --cluster [--quick] [--jobs N]``.

Starts two private backends on free loopback ports: one plain ``redis-server`` and a 3-master
Redis Cluster (``packages/jobs-redis/tests/with_cluster.py``: ``--cluster-enabled yes`` +
``redis-cli --cluster create``, no replicas), both without persistence. On each, the same
workload over three prefixes (on the cluster, three prefixes whose hash tags three different
masters hold): ``enqueue_many`` of ``--jobs`` no-op jobs per prefix (batches of 1,000, the
three prefixes at once), then one ``jobsctl worker`` process per prefix (``--concurrency`` slots)
drains them. Prints enqueue and processing rates (jobs/s over the three prefixes; processing is
from the first poll that counts a row ``done`` to the one that counts them all, so process
start is left out; with it, from the workers' start), backend by backend,
interleaved ``--repeat`` times. Outcomes are counted in the backend (``stats()``), never read
from logs. Both backends are stopped at the end; the shared server is never touched.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import ROOT, median

sys.path.insert(0, str(ROOT / "packages" / "jobs-redis" / "tests"))
from with_cluster import free_ports, private_cluster

APP = "bench.cluster_app"


@contextmanager
def private_server() -> Iterator[str]:
    """Start one plain redis-server on a free loopback port; yield its URL; stop it."""
    [port] = free_ports(1, start=7201)
    workdir = Path(tempfile.mkdtemp(prefix="bench-redis-"))
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while (
            subprocess.run(
                ["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True, check=False
            ).stdout.strip()
            != "PONG"
        ):
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on {port} never answered")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def _prefixes(url: str, count: int = 3) -> list[str]:
    """Fresh prefixes; on a cluster, ones whose hash tags ``count`` different masters hold."""
    tag = uuid.uuid4().hex[:6]
    if not url.startswith("redis+cluster"):
        return [f"bench-{tag}-{i}" for i in range(count)]
    import redis

    client = redis.RedisCluster.from_url(url.replace("redis+cluster", "redis", 1))
    chosen: dict[str, str] = {}
    i = 0
    while len(chosen) < count:
        prefix = f"bench-{tag}-{i}"
        chosen.setdefault(client.get_node_from_key("{" + prefix + "}:seq").name, prefix)
        i += 1
    client.close()
    return list(chosen.values())


async def _enqueue(url: str, prefixes: list[str], jobs: int) -> float:
    from jobs_core.ids import new_id
    from jobs_core.types import EnqueueRequest
    from jobs_redis import RedisDriver

    def batch(start: int) -> list[EnqueueRequest]:
        return [
            EnqueueRequest(
                name="bench.cluster.noop",
                queue="default",
                input={"n": n},
                idempotency_key=f"n{n}",
                tenant_id=None,
                max_attempts=3,
                id=new_id(),
                run_id=new_id(),
            )
            for n in range(start, min(start + 1_000, jobs))
        ]

    drivers = [await RedisDriver.connect(url, prefix=p) for p in prefixes]
    batches = [[batch(s) for s in range(0, jobs, 1_000)] for _ in prefixes]
    started = time.perf_counter()

    async def one(driver: RedisDriver, reqs: list[list[EnqueueRequest]]) -> None:
        for chunk in reqs:
            await driver.enqueue_many(chunk)

    await asyncio.gather(*(one(d, b) for d, b in zip(drivers, batches, strict=True)))
    elapsed = time.perf_counter() - started
    for driver in drivers:
        await driver.close()
    return elapsed


async def _done(url: str, prefixes: list[str]) -> int:
    from jobs_redis import RedisDriver

    total = 0
    for prefix in prefixes:
        driver = RedisDriver(url, prefix=prefix)
        total += sum(s.done for s in await driver.stats())
        await driver.close()
    return total


def _run(url: str, jobs: int, concurrency: int) -> dict[str, Any]:
    prefixes = _prefixes(url)
    enqueue_s = asyncio.run(_enqueue(url, prefixes, jobs))
    total = jobs * len(prefixes)
    started = time.perf_counter()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jobs_core.cli",
                "worker",
                APP,
                "--driver",
                f"{url}?prefix={p}",
                "--concurrency",
                str(concurrency),
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
        )
        for p in prefixes
    ]
    try:
        deadline = time.monotonic() + 900
        first: tuple[float, int] | None = None
        while (done := asyncio.run(_done(url, prefixes))) < total:
            if first is None and done > 0:
                first = (time.perf_counter(), done)
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a worker process died")
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not finish in 900 s")
            time.sleep(0.1)
        ended = time.perf_counter()
        drain_s = ended - started
        if first is None:
            first = (started, 0)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
    return {
        "enqueue_jobs_s": total / enqueue_s,
        "processing_jobs_s": (total - first[1]) / (ended - first[0]),
        "with_start_jobs_s": total / drain_s,
    }


def main(argv: list[str]) -> int:
    """Run the comparison ``argv`` asks for; print one line per backend; answer 0."""
    parser = argparse.ArgumentParser(prog="python -m bench --cluster", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 x 2,000 jobs, one repeat")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per prefix")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved repeats (median)")
    parser.add_argument("--concurrency", type=int, default=32, help="slots per worker")
    args = parser.parse_args(argv)
    jobs, repeat = (2_000, 1) if args.quick else (args.jobs, args.repeat)
    runs: dict[str, list[dict[str, Any]]] = {"one redis, 3 prefixes": [], "cluster": []}
    with private_server() as single, private_cluster() as cluster:
        urls = {"one redis, 3 prefixes": single, "cluster": cluster}
        for rep in range(repeat):
            for name, url in urls.items():
                print(f"round {rep + 1}/{repeat}: {name}", file=sys.stderr, flush=True)
                runs[name].append(_run(url, jobs, args.concurrency))
    print(
        f"3 prefixes x {jobs:,} no-op jobs, one worker process per prefix "
        f"(concurrency {args.concurrency}), medians of {repeat}:"
    )
    for name, results in runs.items():
        where = "3-master cluster, 3 prefixes on 3 masters" if name == "cluster" else name
        print(
            f"  {where}: enqueue {median([r['enqueue_jobs_s'] for r in results]):,.0f} jobs/s, "
            f"processing {median([r['processing_jobs_s'] for r in results]):,.0f} jobs/s "
            f"({median([r['with_start_jobs_s'] for r in results]):,.0f} with process start)"
        )
    return 0
