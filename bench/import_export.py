"""jobs-import-export's figures (issue 19): worker memory and import throughput against a floor.

``python -m bench --import-export`` (``--quick`` for a smoke run) writes a CSV file of orders
(200 MB; 20 MB quick), then, in fresh child processes, interleaved for ``--repeat`` rounds:

- ``ie-import``: a worker process (the memory driver, a real :class:`~jobs_core.Worker`) runs
  ``import_rows`` over the file from a ``local_source``, with the default ``page_bytes`` (1 MiB)
  and ``batch`` (500), into a ``handle`` that only counts rows;
- ``ie-floor``: ``csv.reader`` over the same file and the same pydantic model's
  ``model_validate`` per row, in a plain loop: the work an import cannot avoid;
- ``ie-export``: a worker process runs ``export_rows`` of 2,000,000 rows (200,000 quick) made
  page by page by a keyset reader, to a ``local_sink`` (default ``batch`` 5,000).

Throughput is rows over wall time from the enqueue to the job's end (and, steadier on a shared
machine, over the CPU time of all the process's threads). Memory is the raise of the process's
peak RSS (``ru_maxrss``, the kernel's high-water mark)
over its RSS just before the job was enqueued, after a warm-up run of the same job on a small
file; a sampler thread also records the highest RSS it saw every 5 ms, as a cross-check.
Targets: each raise under 48 MiB; import throughput at least 60% of the floor's.
"""

from __future__ import annotations

import asyncio
import csv
import gc
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bench.common import ROOT, child_argv, child_env, median, rss_kib, run_child

MEMORY_TARGET_MIB = 48
THROUGHPUT_TARGET = 0.60
COLUMNS = ["id", "customer", "note", "total", "placed_at"]


class Order(BaseModel):
    """One row of the bench file (the import's schema and the floor's model)."""

    id: int
    customer: str
    note: str | None = None
    total: Decimal
    placed_at: date


class Input(BaseModel):
    """The bench jobs' input."""

    key: str


def _row(i: int) -> str:
    # Three kinds of record, as files exported from a database and edited in a spreadsheet
    # have: plain (3 in 4), quoted with a comma and a newline, quoted with escaped quotes.
    kind = i % 8
    if kind == 6:
        note = f'"deliver to gate {i % 90}, then\nring twice"'
    elif kind == 7:
        note = f'"the ""{i % 13}"" box"'
    else:
        note = ""
    placed = f"2026-{1 + i % 12:02d}-{1 + i % 28:02d}"
    return f"{i},customer {i % 50_000},{note},{i % 100_000 / 100:.2f},{placed}\n"


def write_file(path: Path, megabytes: float) -> int:
    """Write the bench CSV of about ``megabytes`` MB to ``path``; answer its row count."""
    target = megabytes * 1_000_000
    rows = 0
    written = 0
    with path.open("w", encoding="utf-8", newline="") as f:
        f.write(",".join(COLUMNS) + "\n")
        while written < target:
            step = min(10_000, max(1, int((target - written) // 40)))
            chunk = "".join(_row(i) for i in range(rows, rows + step))
            f.write(chunk)
            written += len(chunk)
            rows += step
    return rows


class _Sampler:
    """The highest RSS seen every 5 ms while running (a cross-check of ``ru_maxrss``)."""

    def __init__(self, enabled: bool = True) -> None:
        self.peak = rss_kib()
        self._enabled = enabled
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss_kib())

    def __enter__(self) -> _Sampler:
        if self._enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._enabled:
            self._thread.join()


def _maxrss_kib() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux


async def _run_job(driver: Any, job: Any, key: str) -> tuple[Any, float, float]:
    from jobs_core import JobState, Worker, use_driver
    from jobs_core.testing import live_count

    with use_driver(driver):
        worker = Worker(driver, poll_interval="5ms", idle_poll_max="20ms")
        running = asyncio.create_task(worker.run())
        started = time.perf_counter()
        cpu = time.process_time()
        queued = await job.enqueue(Input(key=key))
        # The row's stats, not the row: reading it back decodes every step output each time.
        while await live_count(driver):  # noqa: ASYNC110 - the memory driver has no wake here
            await asyncio.sleep(0.05)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
        await worker.stop()
        await running
    info = await driver.introspect.get(queued.id)
    if info.state != JobState.DONE:
        raise RuntimeError(f"the bench job ended {info.state}: {info.last_error}")
    return info, elapsed, cpu


async def child_import(path: str, warmup: str, sample: bool = True) -> dict[str, Any]:
    """Import ``path`` in this process (a worker); answer rows/s and the RSS raise.

    ``sample=False`` leaves the RSS sampler thread out (under callgrind its wake-ups, many more
    of them in the slowed-down run, would be counted as the import's).
    """
    from jobs_core.drivers.memory import MemoryDriver
    from jobs_import_export import ErrorSink, import_rows, local_sink, local_source

    folder = Path(path).parent
    counted = [0]

    def handle(rows: list[Order], input: Input) -> None:
        counted[0] += len(rows)

    job = import_rows(
        name="bench.import",
        input=Input,
        tenant="none",
        source=lambda: local_source(folder),
        key=lambda i: i.key,
        columns=COLUMNS,
        schema=Order,
        handle=handle,
        errors=ErrorSink(sink=lambda: local_sink(folder / "errors"), prefix=lambda i: "bench"),
        idempotency_key=lambda i: i.key,
    )
    driver = MemoryDriver()
    await _run_job(driver, job, Path(warmup).name)
    counted[0] = 0
    gc.collect()
    before = rss_kib()
    with _Sampler(sample) as sampler:
        info, elapsed, cpu = await _run_job(driver, job, Path(path).name)
    await driver.close()
    assert info.result["rows"] == counted[0], (info.result, counted[0])
    return {
        "rows": counted[0],
        "bytes": info.result["bytes"],
        "seconds": elapsed,
        "rows_per_s": counted[0] / elapsed,
        "rows_per_cpu_s": counted[0] / cpu,
        "rss_before_kib": before,
        "peak_raise_kib": _maxrss_kib() - before,
        "sampled_raise_kib": sampler.peak - before,
        "parts": info.result["parts"],
    }


def child_floor(path: str) -> dict[str, Any]:
    """``csv.reader`` plus ``Order.model_validate`` per row over ``path``: answer rows/s."""
    started = time.perf_counter()
    cpu = time.process_time()
    rows = 0
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader)
        for cells in reader:
            Order.model_validate(dict(zip(header, cells, strict=True)))
            rows += 1
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu
    return {
        "rows": rows,
        "seconds": elapsed,
        "rows_per_s": rows / elapsed,
        "rows_per_cpu_s": rows / cpu,
    }


async def child_export(folder: str, rows: int) -> dict[str, Any]:
    """Export ``rows`` generated rows to ``folder`` in this process; answer rows/s and RSS."""
    from jobs_core.drivers.memory import MemoryDriver
    from jobs_import_export import export_rows, local_sink

    def reader(cursor: Any, limit: int) -> tuple[list[dict[str, Any]], Any]:
        start = cursor or 0
        stop = min(start + limit, total[0])
        page = [
            {
                "id": i,
                "customer": f"customer {i % 50_000}",
                "note": None if i % 8 else f"deliver to gate {i % 90}, then\nring twice",
                "total": Decimal(i % 100_000) / 100,
                "placed_at": date(2026, 1 + i % 12, 1 + i % 28),
            }
            for i in range(start, stop)
        ]
        return page, (stop if stop < total[0] else None)

    total = [10_000]
    job = export_rows(
        name="bench.export",
        input=Input,
        tenant="none",
        prefix=lambda i: i.key,
        source=lambda ctx, i: reader,
        columns=COLUMNS,
        sink=lambda: local_sink(folder),
    )
    driver = MemoryDriver()
    await _run_job(driver, job, "warmup")
    total[0] = rows
    gc.collect()
    before = rss_kib()
    with _Sampler() as sampler:
        info, elapsed, _ = await _run_job(driver, job, "export")
    await driver.close()
    return {
        "rows": info.result["rows"],
        "bytes": info.result["bytes"],
        "parts": info.result["parts"],
        "seconds": elapsed,
        "rows_per_s": info.result["rows"] / elapsed,
        "rss_before_kib": before,
        "peak_raise_kib": _maxrss_kib() - before,
        "sampled_raise_kib": sampler.peak - before,
    }


def main(*, quick: bool, repeat: int, markdown: bool, instructions: bool = False) -> int:
    """Run the figures; print the table; answer the exit status (1 when a target is missed).

    With ``instructions`` it also counts, under valgrind's callgrind, the instructions the
    import job and the floor spend on a 4 MB file beyond a 0.2 MB one: a ratio no other process
    on the machine can move, unlike the wall and CPU times.
    """
    megabytes, export_rows_n = (20, 200_000) if quick else (200, 2_000_000)
    rounds = 1 if quick else repeat
    work = Path(tempfile.mkdtemp(prefix="bench-ie-"))
    try:
        path = work / "orders.csv"
        print(f"writing a {megabytes} MB CSV ...", file=sys.stderr, flush=True)
        file_rows = write_file(path, megabytes)
        write_file(work / "warmup.csv", 2)
        size = path.stat().st_size
        runs: dict[str, list[dict[str, Any]]] = {"import": [], "floor": [], "export": []}
        for number in range(rounds):
            print(f"round {number + 1}/{rounds}", file=sys.stderr, flush=True)
            runs["import"].append(
                run_child("ie-import", {"path": str(path), "warmup": str(work / "warmup.csv")})
            )
            runs["floor"].append(run_child("ie-floor", {"path": str(path)}))
            out = work / f"export-{number}"
            runs["export"].append(
                run_child("ie-export", {"folder": str(out), "rows": export_rows_n})
            )
            shutil.rmtree(out, ignore_errors=True)
        for run in runs["import"] + runs["floor"]:
            if run["rows"] != file_rows:
                raise RuntimeError(f"a run read {run['rows']} rows of {file_rows}")
        lines, missed = _table(runs, size, file_rows, export_rows_n, rounds)
        if instructions:
            lines.append("")
            lines.append(_instructions(work))
        print("\n".join(lines))
        if markdown:
            print("\n<!-- bench markdown: paste verbatim -->")
            print("\n".join(lines))
        return 1 if missed else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _instructions(work: Path) -> str:
    """Answer the line comparing instructions per row of the import job and of the floor."""
    small, large = work / "small.csv", work / "large.csv"
    rows = write_file(large, 4) - write_file(small, 0.2)
    counted: dict[tuple[str, Path], int] = {}
    for kind in ("ie-import", "ie-floor"):
        for path in (small, large):
            kwargs: dict[str, Any] = {"path": str(path)}
            if kind == "ie-import":
                kwargs.update(warmup=str(small), sample=False)
            print(f"callgrind {kind} {path.name} ...", file=sys.stderr, flush=True)
            counted[(kind, path)] = _callgrind(child_argv(kind, kwargs))
    ours = (counted[("ie-import", large)] - counted[("ie-import", small)]) / rows
    floor = (counted[("ie-floor", large)] - counted[("ie-floor", small)]) / rows
    return (
        f"Instructions per row (callgrind; a 4 MB file minus a 0.2 MB one, so start-up and "
        f"warm-up cancel): ours {ours:,.0f}, floor {floor:,.0f}: ours / floor throughput "
        f"{floor / ours:.2f}x."
    )


def _callgrind(argv: list[str]) -> int:
    """Run ``argv`` under callgrind; answer the instructions it executed."""
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=1800,
        check=True,
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"callgrind reported no count:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def _table(
    runs: dict[str, list[dict[str, Any]]], size: int, file_rows: int, exported: int, rounds: int
) -> tuple[list[str], list[str]]:
    def med(kind: str, key: str) -> float:
        return median([run[key] for run in runs[kind]])

    ours = med("import", "rows_per_s")
    floor = med("floor", "rows_per_s")
    ratio = ours / floor
    ours_cpu = med("import", "rows_per_cpu_s")
    floor_cpu = med("floor", "rows_per_cpu_s")
    import_mib = med("import", "peak_raise_kib") / 1024
    export_mib = med("export", "peak_raise_kib") / 1024
    missed = []
    if import_mib >= MEMORY_TARGET_MIB:
        missed.append("import memory")
    if export_mib >= MEMORY_TARGET_MIB:
        missed.append("export memory")
    if ratio < THROUGHPUT_TARGET:
        missed.append("import throughput")

    def mark(ok: bool) -> str:
        return "met" if ok else "MISSED"

    lines = [
        f"jobs-import-export, {rounds} round(s), medians; file {size / 1e6:,.0f} MB, "
        f"{file_rows:,} rows; export {exported:,} rows",
        "",
        "| figure | ours | floor | ours / floor | target |",
        "|---|---:|---:|---:|---|",
        f"| import throughput (rows/s) | {ours:,.0f} | {floor:,.0f} | {ratio:.2f}x | "
        f">= {THROUGHPUT_TARGET:.2f}x ({mark(ratio >= THROUGHPUT_TARGET)}) |",
        f"| import rows per CPU second (all threads; steadier on a shared machine) | "
        f"{ours_cpu:,.0f} | {floor_cpu:,.0f} | {ours_cpu / floor_cpu:.2f}x | |",
        f"| import throughput (MB/s) | {size / 1e6 / med('import', 'seconds'):,.1f} | "
        f"{size / 1e6 / med('floor', 'seconds'):,.1f} | | |",
        f"| worker peak RSS raise, import (MiB) | {import_mib:,.1f} | | | "
        f"< {MEMORY_TARGET_MIB} ({mark(import_mib < MEMORY_TARGET_MIB)}) |",
        f"| worker peak RSS raise, export (MiB) | {export_mib:,.1f} | | | "
        f"< {MEMORY_TARGET_MIB} ({mark(export_mib < MEMORY_TARGET_MIB)}) |",
        f"| export throughput (rows/s) | {med('export', 'rows_per_s'):,.0f} | | | |",
        "",
        f"RSS before the job: import {med('import', 'rss_before_kib') / 1024:,.0f} MiB, export "
        f"{med('export', 'rss_before_kib') / 1024:,.0f} MiB; sampled every 5 ms the raise was "
        f"{med('import', 'sampled_raise_kib') / 1024:,.1f} MiB (import) and "
        f"{med('export', 'sampled_raise_kib') / 1024:,.1f} MiB (export). Import: "
        f"{med('import', 'parts'):,.0f} pages of 1 MiB, batch 500; export: "
        f"{med('export', 'parts'):,.0f} parts of 5,000 rows.",
    ]
    return lines, missed
