"""Backfill benchmarks (issue 17): ``nox -s bench -- --backfill [--quick]``.

Two figures, on the pg driver in a ``bench_backfill`` database made fresh per run:

- **the killed pass**: a keyset backfill over ``--rows`` rows (1,000,000; 20,000 with
  ``--quick``), batch 1,000, rate ``--rate`` pages/s, run by a ``jobsctl worker`` subprocess that
  is SIGKILLed once ``--kill-at`` of the rows are done; a second worker takes the pass over when
  the lease lapses. Reported: rows/s over the whole pass (kill and lease lapse included), the
  pages handled twice (at most one may be), whether every row was handled, the ledger row, and
  each worker's peak RSS (sampled from ``/proc`` every 0.2 s).
- **the throttle**: a 20-page pass at ``rate=2`` (its wall time; 9.5-11 s expected), and a pass
  that fails on its 21st page and is retried: the time from the 21st page's first call to its
  second is the retry's backoff plus the replay of the 20 completed pages, which re-pays none of
  their pauses (the 10 s it would cost).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import psycopg

from bench.common import ROOT, drop_database, fresh_database, rss_kib

DB = "bench_backfill"


def _fill(url: str, rows: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_posts (id bigint PRIMARY KEY, handled int NOT NULL)")
        conn.execute("CREATE TABLE bench_pages (first_id bigint NOT NULL)")
        conn.execute("INSERT INTO bench_posts SELECT i, 0 FROM generate_series(1, %s) AS i", [rows])
        conn.execute("VACUUM (ANALYZE) bench_posts")


def _worker(url: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        "-m",
        "jobs_core.cli",
        "worker",
        "bench.backfill_app",
        "--driver",
        url,
        "--visibility-timeout",
        "2s",
        "--log-level",
        "warning",
    ]
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.Popen(argv, env=full, cwd=ROOT, stderr=subprocess.PIPE)


def _ledger_rows(url: str) -> tuple[str, int] | None:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT status, rows FROM jobs.backfills ORDER BY started_at DESC LIMIT 1"
        ).fetchone()
    return None if row is None else (row[0], int(row[1]))


def _sample(proc: subprocess.Popen[bytes], peak: dict[str, int], key: str) -> None:
    with contextlib.suppress(FileNotFoundError, RuntimeError, ProcessLookupError):
        peak[key] = max(peak.get(key, 0), rss_kib(proc.pid))


def killed_pass(rows: int, rate: float, kill_at: float) -> dict[str, Any]:
    """Run the killed pass; answer its figures (see the module docstring)."""
    url = fresh_database(DB)
    env = {"BENCH_BF_URL": url, "BENCH_BF_BATCH": "1000", "BENCH_BF_RATE": str(rate)}
    os.environ.update(env)
    _fill(url, rows)
    from bench.backfill_app import posts
    from jobs_pg import PostgresDriver

    async def enqueue() -> str:
        driver = await PostgresDriver.connect(url, min_size=1, max_size=2)
        try:
            await driver.migrate()
            from jobs_core import use_driver

            with use_driver(driver):
                return str((await posts.enqueue()).id)
        finally:
            await driver.close()

    job_id = asyncio.run(enqueue())
    peak: dict[str, int] = {}
    started = time.monotonic()
    first = _worker(url, env)
    while True:
        _sample(first, peak, "first")
        found = _ledger_rows(url)
        if found is not None and found[1] >= rows * kill_at:
            break
        if first.poll() is not None:
            raise RuntimeError(f"the first worker exited: {first.stderr.read().decode()[-2000:]}")
        time.sleep(0.2)
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed_rows = (_ledger_rows(url) or ("", 0))[1]
    second = _worker(url, env)
    try:
        while True:
            _sample(second, peak, "second")
            found = _ledger_rows(url)
            if found is not None and found[0] == "completed":
                break
            if second.poll() is not None:
                raise RuntimeError(f"the second worker exited: {second.stderr.read().decode()}")
            time.sleep(0.2)
        seconds = time.monotonic() - started
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)
    with psycopg.connect(url, autocommit=True) as conn:
        unhandled, twice = conn.execute(
            "SELECT count(*) FILTER (WHERE handled = 0), count(*) FILTER (WHERE handled > 1) "
            "FROM bench_posts"
        ).fetchone() or (0, 0)
        redone = conn.execute(
            "SELECT count(*) FROM (SELECT first_id FROM bench_pages GROUP BY first_id "
            "HAVING count(*) > 1) AS r"
        ).fetchone()
        ledger = conn.execute(
            "SELECT status, rows FROM jobs.backfills WHERE id = %s", [job_id]
        ).fetchone()
        state = conn.execute(
            "SELECT state, attempts FROM jobs.jobs WHERE id = %s", [job_id]
        ).fetchone()
    return {
        "rows": rows,
        "rate": rate,
        "seconds": seconds,
        "rows_per_s": rows / seconds,
        "killed_at_rows": killed_rows,
        "pages_redone": int(redone[0]) if redone else None,
        "rows_handled_twice": int(twice),
        "rows_unhandled": int(unhandled),
        "ledger": list(ledger) if ledger else None,
        "job": list(state) if state else None,
        "rss_kib": peak,
    }


def throttle(rate: float = 2.0, pages: int = 20) -> dict[str, Any]:
    """Time a ``pages``-page pass at ``rate``, then a retried pass's replay of ``pages`` pages."""
    from jobs_core import JobRegistry, Retry, backfill, use_driver
    from jobs_core.testing import run_jobs
    from jobs_pg import PostgresDriver

    url = fresh_database(DB)
    calls: dict[int, list[float]] = {}

    def make(name: str, total: int, fail_on: int | None, registry: JobRegistry) -> Any:
        def read(cursor: Any, cancel: Any, input: Any) -> tuple[list[int], int | None]:
            start = int(cursor or 0)
            return [start], (start + 1 if start + 1 < total else None)

        def handle(rows: list[int], cancel: Any) -> None:
            calls.setdefault(rows[0], []).append(time.monotonic())
            if rows[0] == fail_on and len(calls[rows[0]]) == 1:
                raise ConnectionError("a page fails once")

        return backfill(
            name=name,
            tenant="none",
            pages=read,
            handle=handle,
            rate=rate,
            retry=Retry(attempts=2, delay="100ms", jitter=False, backoff="fixed"),
            registry=registry,
        )

    async def main() -> dict[str, Any]:
        driver = await PostgresDriver.connect(url, min_size=1, max_size=4)
        await driver.migrate()
        try:
            registry = JobRegistry()
            timed = make("bench.rate", pages, None, registry)
            replayed = make("bench.replay", pages + 1, pages, registry)
            with use_driver(driver):
                await timed.enqueue()
                began = time.monotonic()
                await run_jobs(driver, registry=registry, timeout="120s")
                wall = time.monotonic() - began
                calls.clear()
                await replayed.enqueue()
                await run_jobs(driver, registry=registry, timeout="120s")
            first, again = calls[pages]
            return {
                "rate": rate,
                "pages": pages,
                "pass_seconds": wall,
                "replay_gap_seconds": again - first,
                "retry_delay_seconds": 0.1,
                "would_repay_seconds": pages / rate,
            }
        finally:
            await driver.close()

    return asyncio.run(main())


def main(argv: list[str]) -> int:
    """Run the backfill figures; print a table (and JSON with ``--json``)."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.backfill", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="20,000 rows: a smoke run")
    parser.add_argument("--rows", type=int, default=None, help="rows in the killed pass")
    parser.add_argument("--rate", type=float, default=50.0, help="pages/s of the killed pass")
    parser.add_argument("--kill-at", type=float, default=0.4, help="share done at the SIGKILL")
    parser.add_argument("--no-throttle", action="store_true", help="skip the rate=2 figure")
    parser.add_argument("--json", dest="json_out", help="write the results here")
    args = parser.parse_args(argv)
    rows = args.rows or (20_000 if args.quick else 1_000_000)
    results: dict[str, Any] = {}
    try:
        results["killed"] = killed_pass(rows, args.rate, args.kill_at)
        if not args.no_throttle:
            results["throttle"] = throttle()
    finally:
        drop_database(DB)
    k = results["killed"]
    rss = k["rss_kib"]
    table = [
        (f"killed pass: rows, batch 1,000, rate {k['rate']:g}/s", f"{k['rows']:,}"),
        (
            "rows/s over the whole pass (kill and 2 s lease lapse included)",
            f"{k['rows_per_s']:,.0f}",
        ),
        ("SIGKILL at ledger rows", f"{k['killed_at_rows']:,}"),
        ("pages handled twice", str(k["pages_redone"])),
        ("rows handled twice / never", f"{k['rows_handled_twice']:,} / {k['rows_unhandled']:,}"),
        ("ledger row (status, rows)", str(k["ledger"])),
        ("job (state, attempts spent)", str(k["job"])),
        (
            "worker peak RSS, killed / resumed (MiB)",
            f"{rss.get('first', 0) / 1024:,.0f} / {rss.get('second', 0) / 1024:,.0f}",
        ),
    ]
    if "throttle" in results:
        t = results["throttle"]
        table += [
            (
                f"{t['pages']}-page pass at rate={t['rate']:g}: wall time (s)",
                f"{t['pass_seconds']:.2f}",
            ),
            (
                f"replay of {t['pages']} completed pages: the failed page's retry gap (s; 0.1 s "
                f"backoff, {t['would_repay_seconds']:.0f} s if the pauses were re-paid)",
                f"{t['replay_gap_seconds']:.3f}",
            ),
        ]
    print("| figure | value |")
    print("|---|---:|")
    for label, value in table:
        print(f"| {label} | {value} |")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
