"""The orchestrator's side of each figure: prepare the backend, start the children, collect.

Every figure of every system runs once per round and the rounds repeat (``--repeat``), so a
slow minute of the shared machine hits every system alike; the table quotes medians.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.common import (
    Background,
    child_argv,
    drop_database,
    flush_redis,
    fresh_database,
    median,
    pg_commits,
    pg_count,
    run_child,
)

# ``BENCH_DB_SUFFIX`` lets two bench runs share one server without dropping each other's data.
OURS_DB = "bench_ours" + os.environ.get("BENCH_DB_SUFFIX", "")
FLOOR_DB = "bench_floor" + os.environ.get("BENCH_DB_SUFFIX", "")


@dataclass(frozen=True)
class Sizes:
    """How much work each figure does."""

    single: int
    batch_total: int
    processing: int
    durable: int
    pickup: int
    floor_serial: int
    floor_batch: int
    floor_redis_plain: int
    floor_redis_pipelined: int

    @classmethod
    def full(cls) -> Sizes:
        """The issue's sizes."""
        return cls(2_000, 20_000, 10_000, 2_000, 50, 2_000, 20_000, 10_000, 100_000)

    @classmethod
    def quick(cls) -> Sizes:
        """A smoke run: every path exercised, figures noisier."""
        return cls(300, 5_000, 2_000, 300, 10, 300, 5_000, 2_000, 20_000)


BATCH = 1_000
"""Inputs per ``enqueue_many`` call in the batch-enqueue figure."""


@dataclass
class Figure:
    """One figure of one system: every repeat's result and the quoted median."""

    figure: str
    system: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    failures: int = 0

    def value(self, key: str = "value") -> float | None:
        """Answer the median of ``key`` over the runs (``None`` with no run)."""
        values = [r[key] for r in self.runs if key in r]
        return median(values) if values else None

    def as_json(self) -> dict[str, Any]:
        """Answer a JSON-able record."""
        out: dict[str, Any] = {"figure": self.figure, "system": self.system, "runs": self.runs}
        for key in ("value", "p50", "p95", "max"):
            value = self.value(key)
            if value is not None:
                out[f"median_{key}"] = value
        if self.error:
            out["error"] = self.error
            out["failures"] = self.failures
        return out


class Results:
    """Every figure collected in this run, by ``(figure, system)``."""

    def __init__(self) -> None:
        """Start empty."""
        self.figures: dict[tuple[str, str], Figure] = {}
        self.notes: list[str] = []

    def get(self, figure: str, system: str) -> Figure:
        """Answer (creating) the record of ``figure`` for ``system``."""
        key = (figure, system)
        if key not in self.figures:
            self.figures[key] = Figure(figure, system)
        return self.figures[key]

    def record(self, figure: str, system: str, run: Callable[[], dict[str, Any]]) -> None:
        """Run one repeat; keep its result, or the error (the run goes on without it)."""
        entry = self.get(figure, system)
        if entry.failures >= 2:
            return  # it failed twice: do not spend the run's time failing again
        started = time.monotonic()
        try:
            result = run()
        except Exception as exc:  # one failed repeat never ends the run
            entry.failures += 1
            entry.error = str(exc).splitlines()[0][:300]
            print(f"  {figure:<16} {system:<14} FAILED: {exc}", file=sys.stderr, flush=True)
            return
        entry.runs.append(result)
        if "p50" in result:
            shown = f"p50 {result['p50']:.2f} p95 {result['p95']:.2f} max {result['max']:.2f} ms"
        elif "checkpoints" in result:
            shown = ", ".join(
                f"{int(k):,}: {v['rss_kib'] / 1024:,.0f} MiB"
                for k, v in sorted(result["checkpoints"].items(), key=lambda kv: int(kv[0]))
            )
        elif result.get("unit") == "ratio":
            rates = ", ".join(f"{k} {v:,.0f}" for k, v in result.get("rates", {}).items())
            shown = f"{result['value']:.2f} ({rates} jobs/s)"
        else:
            shown = f"{result.get('value', 0):,.0f} {result.get('unit', '')}"
        took = time.monotonic() - started
        print(f"  {figure:<16} {system:<14} {shown}  ({took:.1f} s)", file=sys.stderr, flush=True)


# --- our drivers -------------------------------------------------------------------------------


def ours_url(driver: str) -> str:
    """Prepare an empty backend for our ``driver`` and answer its URL."""
    if driver == "memory":
        return "memory://"
    if driver == "pg":
        url = fresh_database(OURS_DB)
    elif driver == "redis":
        url = flush_redis("ours")
    else:
        raise ValueError(driver)
    run_child("ours-migrate", {"url": url})
    return url


def ours_enqueue_single(driver: str, sizes: Sizes) -> dict[str, Any]:
    """One ``await enqueue`` at a time."""
    return run_child("ours-enqueue-single", {"url": ours_url(driver), "n": sizes.single})


def ours_enqueue_many(driver: str, sizes: Sizes) -> dict[str, Any]:
    """``enqueue_many`` in batches of 1,000."""
    return run_child(
        "ours-enqueue-many", {"url": ours_url(driver), "n": sizes.batch_total, "batch": BATCH}
    )


def ours_drain(
    driver: str, which: str, n: int, concurrency: int, log: str | None = None
) -> dict[str, Any]:
    """Fill ``n`` rows (another process, except on memory) then drain them with one worker.

    ``log``: the worker's logging, as ``jobsctl worker`` sets it up (``"warning"``, ``"text"``
    or ``"json"``); quiet by default.
    """
    url = ours_url(driver)
    in_process = driver == "memory"
    if not in_process:
        run_child("ours-fill", {"url": url, "which": which, "n": n})
    before = pg_commits(OURS_DB) if driver == "pg" else 0
    args = {"url": url, "which": which, "n": n, "concurrency": concurrency, "fill_here": in_process}
    result = run_child("ours-drain", args | ({} if log is None else {"log": log}))
    if driver == "pg":
        # The worker's own commits (its count polls included: a few dozen over the run).
        result["commits_per_job"] = (pg_commits(OURS_DB) - before) / n
    return result


LOG_MODES = ("warning", "text", "json")
"""The worker logging the log-cost figure compares, in the order each repeat drains them."""


def ours_cli_defaults(driver: str, sizes: Sizes) -> dict[str, Any]:
    """Drain no-op rows with ``jobsctl worker bench.ours --driver URL``: the CLI at its defaults.

    The worker is the CLI as a user starts it, nothing else on its command line (default
    concurrency, log level info with one text line a job, written to a file as a log collector
    would read it); timed like the peers' CLIs, from its first body start to the poll that counts
    every row ``done``. pg only: the figure the out-of-the-box target sets against ``pgq run``.
    """
    from bench.peers import processing

    if driver != "pg":
        raise ValueError("the CLI-defaults figure runs on pg")
    url = ours_url(driver)
    n = sizes.processing
    return processing(
        fill=lambda: run_child("ours-fill", {"url": url, "which": "noop", "n": n}),
        worker_argv=[sys.executable, "-m", "jobs_core", "worker", "bench.ours", "--driver", url],
        count=lambda: _done_rows(url),
        gate=lambda: _drained(url),
        n=n,
        pg_database=OURS_DB,
    )


def _drained(url: str) -> bool:
    """Answer whether no row waits or runs: two probes of the live-row partial indexes."""
    return bool(
        pg_count(
            url,
            "SELECT (NOT EXISTS (SELECT 1 FROM jobs.jobs"
            " WHERE state IN ('ready', 'delayed', 'suspended'))"
            " AND NOT EXISTS (SELECT 1 FROM jobs.jobs WHERE state = 'running'))::int",
        )
    )


def _done_rows(url: str) -> int:
    return pg_count(url, "SELECT count(*) FROM jobs.jobs WHERE state = 'done'")


def ours_log_cost(driver: str, sizes: Sizes, concurrency: int) -> dict[str, Any]:
    """Answer the no-op drain rate with per-job log lines as a share of it at ``warning``.

    The lines are the CLI's default (info, one text line a job) and ``--log-format json``. The
    three drains run back to back in one repeat (a slow minute of the machine hits them
    alike); a value of 1.00 means the lines cost nothing, 0.85 a 15% loss.
    """
    rates = {
        mode: ours_drain(driver, "noop", sizes.processing, concurrency, log=mode)["value"]
        for mode in LOG_MODES
    }
    return {
        "value": rates["text"] / rates["warning"],
        "json": rates["json"] / rates["warning"],
        "rates": rates,
        "unit": "ratio",
    }


def ours_pickup(driver: str, sizes: Sizes, concurrency: int) -> dict[str, Any]:
    """An idle worker process; probes enqueued 200 ms apart by another process."""
    url = ours_url(driver)
    args = {"url": url, "n": sizes.pickup, "concurrency": concurrency}
    if driver == "memory":
        # The memory store lives in one process: the enqueuer is a thread with its own loop.
        return run_child("ours-latency-worker", args | {"enqueue_here": True})
    worker = Background(child_argv("ours-latency-worker", args | {"enqueue_here": False}))
    try:
        worker.wait_ready()
        run_child("ours-latency-enqueuer", {"url": url, "n": sizes.pickup, "gap_ms": 200})
        return worker.finish(timeout=120)
    finally:
        worker.terminate()


def ours_rss(driver: str, checkpoints: list[int], concurrency: int) -> dict[str, Any]:
    """Worker RSS after each checkpoint of no-op jobs (filled up front).

    On a PostgreSQL server with autovacuum off (this machine's), a thread stands in for it
    while the worker runs: without it the claim walks every settled row's dead index entries
    and a million-job drain slows to a crawl, which no production server would show.
    """
    url = ours_url(driver)
    in_process = driver == "memory"
    if not in_process:
        run_child("ours-fill", {"url": url, "which": "noop", "n": max(checkpoints)}, timeout=3600)
    vacuum = _Vacuum(url) if driver == "pg" and not _autovacuum_on(url) else None
    try:
        return run_child(
            "ours-rss",
            {
                "url": url,
                "checkpoints": checkpoints,
                "concurrency": concurrency,
                "fill_here": in_process,
            },
            timeout=4 * 3600,
        )
    finally:
        if vacuum is not None:
            vacuum.stop()


def _autovacuum_on(url: str) -> bool:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
    return bool(row and row[0] == "on")


class _Vacuum:
    """Runs ``VACUUM (ANALYZE)`` on a database every :data:`VACUUM_EVERY_S` s until stopped."""

    def __init__(self, url: str) -> None:
        import threading

        self.url = url
        self.stopped = threading.Event()
        self.runs = 0
        self.thread = threading.Thread(target=self._loop, name="bench-vacuum", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stopped.wait(VACUUM_EVERY_S):
                conn.execute("VACUUM (ANALYZE)")
                self.runs += 1

    def stop(self) -> None:
        """Stop after the current ``VACUUM``; report how many ran."""
        self.stopped.set()
        self.thread.join()
        print(f"  rss: {self.runs} VACUUM run(s) stood in for autovacuum", file=sys.stderr)


VACUUM_EVERY_S = 20.0


def cleanup_ours(drivers: list[str]) -> None:
    """Drop what our figures on ``drivers`` created (nothing of a backend this run left alone)."""
    try:
        if "pg" in drivers:
            drop_database(OURS_DB)
        if "redis" in drivers:
            flush_redis("ours")
    except Exception as exc:  # a server may be down; nothing else to clean
        print(f"  cleanup: {exc}", file=sys.stderr)


# --- floors ------------------------------------------------------------------------------------


def floor(name: str, n: int) -> dict[str, Any]:
    """Run one floor in a child against a fresh database or db index."""
    url = fresh_database(FLOOR_DB) if name.startswith("pg") else flush_redis("floor")
    return run_child(f"floor-{name}", {"url": url, "n": n})


def cleanup_floors() -> None:
    """Drop the floors' database and empty their db index."""
    try:
        drop_database(FLOOR_DB)
        flush_redis("floor")
    except Exception as exc:
        print(f"  cleanup: {exc}", file=sys.stderr)
