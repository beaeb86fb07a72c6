"""The peer libraries, each used the way its documentation recommends.

A peer module declares ``NAME``, ``VERSION`` (the pinned one), ``BACKEND`` (``pg`` or
``redis``), ``SETTINGS`` (the worker command and concurrency used, for the README), ``FIGURES``
(figure name -> ``fn(sizes) -> result``, run in the orchestrator), ``WORKLOADS`` (name -> the
coroutine or function a child runs) and ``cleanup()``.

The shared shape of the worker figures, for every peer:

* processing: the jobs are queued first (the peer's batch API, another process), then the peer's
  own worker CLI starts; the rate is ``n`` over the time from the first body's first line (each
  body appends ``time.time_ns()`` to a mark file once per process) to the orchestrator's poll
  (every 10 ms) that counted ``n`` completed jobs in the backend;
* pickup: the worker CLI starts, one warm-up job proves it is up, it idles 1.5 s, then another
  process enqueues probes 200 ms apart, each carrying ``time.time_ns()`` taken just before the
  enqueue call; each body's first line records ``now - t`` into a latency file.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from bench.common import (
    POLLS,
    Background,
    close_pg_counts,
    mark_file,
    percentile,
    pg_commits,
    poll_until,
    read_first_ns,
    run_child,
)

PEERS = {
    "procrastinate": ("bench.peers.procrastinate_peer", "procrastinate"),
    "pgqueuer": ("bench.peers.pgqueuer_peer", "pgqueuer"),
    "dbos": ("bench.peers.dbos_peer", "dbos"),
    "arq": ("bench.peers.arq_peer", "arq"),
    "rq": ("bench.peers.rq_peer", "rq"),
    "dramatiq": ("bench.peers.dramatiq_peer", "dramatiq"),
}

MARK_ENV = "BENCH_MARK_FILE"
LATENCY_ENV = "BENCH_LATENCY_FILE"
POLL = 0.01
"""Seconds between the orchestrator's count polls (at most this much is added to a run)."""


def available_peers(only: Sequence[str]) -> tuple[dict[str, ModuleType], list[str]]:
    """Answer the peer modules whose library imports here, and why the others do not.

    ``only`` names peers (each may be a comma list: ``--peer pgqueuer,dbos``); empty means all.

    Raises:
        SystemExit: a name that is no peer (a typo would otherwise run none of them).
    """
    only = [name for entry in only for name in entry.split(",") if name]
    unknown = sorted(set(only) - set(PEERS))
    if unknown:
        raise SystemExit(
            f"--peer: no peer named {', '.join(unknown)}; the peers: {', '.join(PEERS)}"
        )
    found: dict[str, ModuleType] = {}
    why: list[str] = []
    for name, (module, package) in PEERS.items():
        if only and name not in only:
            continue
        if importlib.util.find_spec(package) is None:
            why.append(f"peer {name}: {package} not installed (run through nox -s bench)")
            continue
        found[name] = importlib.import_module(module)
    return found, why


async def run_peer_workload(peer: str, workload: str, **kwargs: Any) -> dict[str, Any]:
    """Child side: run ``peer``'s ``workload`` (what ``bench.child peer`` calls)."""
    module = importlib.import_module(PEERS[peer][0])
    func = module.WORKLOADS[workload]
    if inspect.iscoroutinefunction(func):
        return await func(**kwargs)  # type: ignore[no-any-return]
    return await asyncio.to_thread(func, **kwargs)  # type: ignore[no-any-return]


def child(peer: str, workload: str, **kwargs: Any) -> dict[str, Any]:
    """Run ``peer``'s ``workload`` in a fresh child process."""
    return run_child("peer", {"peer": peer, "workload": workload, **kwargs})


# --- what bodies call (in the peer's worker process) ---------------------------------------------

_marked = False


def body_started() -> None:
    """First line of a no-op body: record this process's first body start, once."""
    global _marked
    if not _marked:
        _marked = True
        now = time.time_ns()
        path = os.environ.get(MARK_ENV)
        if path:
            with open(path, "a") as f:
                f.write(f"{now}\n")


def body_latency(sent_ns: int) -> None:
    """First line of a pickup probe: record ``now - sent_ns`` (a warm-up probe sends 0)."""
    now = time.time_ns()
    if sent_ns <= 0:
        return
    path = os.environ.get(LATENCY_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{now - sent_ns}\n")


# --- orchestrator-side shapes ------------------------------------------------------------------


def processing(
    *,
    fill: Callable[[], Any],
    worker_argv: list[str],
    count: Callable[[], int],
    n: int,
    unit: str = "jobs/s",
    cwd: Path | None = None,
    extra: dict[str, Any] | None = None,
    gate: Callable[[], bool] | None = None,
    pg_database: str | None = None,
) -> dict[str, Any]:
    """Queue ``n`` jobs with ``fill``, start the worker CLI, time until ``count() >= n``.

    With ``gate`` (a cheap backend probe, e.g. "the queue is empty"), ``count`` (which may scan)
    is only called once the gate passes. With ``pg_database`` the result also carries the
    worker's commits per job (the orchestrator's count polls subtracted).
    """
    fill()
    before = pg_commits(pg_database) if pg_database else 0
    polls = POLLS[0]
    mark = mark_file()
    os.environ[MARK_ENV] = str(mark)
    try:
        worker = Background(worker_argv, tag="peer-worker", **({"cwd": cwd} if cwd else {}))
    finally:
        del os.environ[MARK_ENV]
    try:
        finished = poll_until(
            lambda: _alive(worker) or (count() if gate is None or gate() else 0),
            n,
            timeout=900,
            interval=POLL,
        )
        done = count()
        first = read_first_ns(mark) / 1e9
    except Exception as exc:
        raise AssertionError(f"{exc}\n{worker.stderr_tail()}") from None
    finally:
        worker.terminate()
        close_pg_counts()
        mark.unlink(missing_ok=True)
    if done != n:
        raise AssertionError(f"counted {done} completed jobs, expected {n}")
    result = {"value": n / (finished - first), "unit": unit, "n": n, "seconds": finished - first}
    if pg_database:
        # The worker was terminated above, so its backends exited and flushed their counts.
        own = pg_commits(pg_database) - before - (POLLS[0] - polls) - 1
        result["commits_per_job"] = own / n
    return result | (extra or {})


def _alive(worker: Background) -> int:
    if worker.proc.poll() is not None:
        raise AssertionError(f"the worker exited ({worker.proc.returncode})")
    return 0


def pickup(
    *,
    worker_argv: list[str],
    warm_up: Callable[[], Any],
    count: Callable[[], int],
    enqueue_probes: Callable[[int], Any],
    n: int,
    cwd: Path | None = None,
) -> dict[str, Any]:
    """Idle worker CLI; ``n`` probes from another process 200 ms apart; p50/p95/max in ms."""
    latencies = mark_file()
    os.environ[LATENCY_ENV] = str(latencies)
    try:
        worker = Background(worker_argv, tag="peer-worker", **({"cwd": cwd} if cwd else {}))
    finally:
        del os.environ[LATENCY_ENV]
    try:
        warm_up()
        poll_until(lambda: _alive(worker) or count(), 1, timeout=120, interval=0.05)
        time.sleep(1.5)
        enqueue_probes(n)
        poll_until(lambda: _alive(worker) or count(), n + 1, timeout=60, interval=0.05)
        done = count()
        ms = [int(x) / 1e6 for x in latencies.read_text().split()]
    except Exception as exc:
        raise AssertionError(f"{exc}\n{worker.stderr_tail()}") from None
    finally:
        worker.terminate()
        close_pg_counts()
        latencies.unlink(missing_ok=True)
    if done != n + 1 or len(ms) != n:
        raise AssertionError(f"counted {done} done and {len(ms)} latencies, expected {n + 1}/{n}")
    return {
        "p50": percentile(ms, 50),
        "p95": percentile(ms, 95),
        "max": max(ms),
        "n": n,
        "unit": "ms",
    }


async def paced(n: int, send: Callable[[int], Any], gap: float = 0.2) -> dict[str, Any]:
    """Call ``send(time.time_ns())`` ``n`` times, ``gap`` s apart (awaiting it if async)."""
    for _ in range(n):
        result = send(time.time_ns())
        if inspect.isawaitable(result):
            await result
        await asyncio.sleep(gap)
    return {"value": n, "unit": "probes"}


def timed(n: int, started: float, **extra: Any) -> dict[str, Any]:
    """Answer a rate result for ``n`` jobs since ``started`` (``time.perf_counter()``)."""
    elapsed = time.perf_counter() - started
    return {"value": n / elapsed, "unit": "jobs/s", "n": n, "seconds": elapsed, **extra}
