"""Profile the hot paths on the memory driver with pyinstrument: ``python -m bench --profile``.

Two workloads in this process, each a real :class:`~jobs_core.worker.Worker` draining a filled
queue: no-op jobs (claim -> execute -> settle) and 3-step jobs (plus the step writes). Only the
drain is profiled (the fill is not). Prints, for each, the call tree (pyinstrument's text
renderer, frames above 1 % shown) and the functions with the most self time, grouped by file, so
the cost of each layer is visible; then, from a second drain under :mod:`cProfile`, the Python
function calls per job, a count that does not drift with the machine's load the way sampled
times do. The memory driver is the profile target because it has no I/O: what is left is the
Python work per job.
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import pstats
from collections import Counter
from collections.abc import Callable
from typing import Any

from bench import ours


async def _drain(
    which: str, n: int, concurrency: int, start: Callable[[], None], stop: Callable[[], None]
) -> None:
    """Fill a queue with ``n`` jobs, then drain it between ``start()`` and ``stop()``."""
    driver = await ours.open_ours("memory://")
    await ours.fill(driver, which, n)
    ours.SEEN.count = 0
    worker = ours.Worker(driver, queues=[ours.QUEUE], concurrency=concurrency)
    start()
    running = asyncio.create_task(worker.run())
    # Watch this process's own counter first: a stats() poll scans every live row.
    while ours.SEEN.count < n:  # noqa: ASYNC110 - bodies run on this loop; a poll is cheapest
        await asyncio.sleep(0.05)
    while await ours.done_count(driver) < n:  # noqa: ASYNC110 - the count lives in the driver
        await asyncio.sleep(0.001)
    stop()
    await worker.stop()
    await running
    await driver.close()


def _self_times(frame: Any, into: Counter[str], files: Counter[str]) -> None:
    if frame is None or frame.is_synthetic:
        return  # a synthetic "[self]" frame's time is already its parent's total_self_time
    name = f"{frame.function} ({_short(frame.file_path)}:{frame.line_no})"
    into[name] += frame.total_self_time
    files[_short(frame.file_path)] += frame.total_self_time
    for child in frame.children:
        _self_times(child, into, files)


def _short(path: str | None) -> str:
    if not path:
        return "?"
    for marker in ("site-packages/", "src/", "lib/python3"):
        if marker in path:
            return path.split(marker, 1)[1]
    return os.path.basename(path)


def _profile(label: str, which: str, n: int, concurrency: int) -> None:
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.0005, async_mode="disabled")
    asyncio.run(_drain(which, n, concurrency, profiler.start, profiler.stop))
    session = profiler.last_session
    assert session is not None
    print(f"\n=== {label}: {n:,} jobs, concurrency {concurrency}, {session.duration:.2f} s ===")
    print(f"{session.duration / n * 1e6:.0f} µs of wall time per job (drain only, profiled)\n")
    print(profiler.output_text(unicode=False, color=False, show_all=False, time="percent_of_total"))
    functions: Counter[str] = Counter()
    files: Counter[str] = Counter()
    _self_times(session.root_frame(), functions, files)
    total = sum(functions.values()) or 1
    print("self time by file (top 15):")
    for name, seconds in files.most_common(15):
        print(f"  {seconds / total * 100:5.1f}%  {name}")
    print("self time by function (top 25):")
    for name, seconds in functions.most_common(25):
        print(f"  {seconds / total * 100:5.1f}%  {name}")
    _count_calls(which, n, concurrency)


def _count_calls(which: str, n: int, concurrency: int) -> None:
    """Drain ``n`` more jobs under cProfile; print the Python function calls per job."""
    counter = cProfile.Profile()
    asyncio.run(_drain(which, n, concurrency, counter.enable, counter.disable))
    stats = pstats.Stats(counter)
    print(f"\nPython function calls per job (cProfile, drain only): {stats.total_calls / n:.1f}")
    print("most called per job (top 15):")
    rows: Any = stats.stats  # type: ignore[attr-defined]
    by_calls = sorted(rows.items(), key=lambda item: -item[1][1])
    for (path, line, function), (_, calls, _, _, _) in by_calls[:15]:
        print(f"  {calls / n:6.2f}  {function} ({_short(path)}:{line})")


def main(*, quick: bool = False) -> int:
    """Profile the no-op and the 3-step paths; answer the exit code."""
    import logging

    logging.basicConfig(level=logging.WARNING)
    n = 5_000 if quick else 20_000
    _profile("claim -> execute -> settle (no-op)", "noop", n, 32)
    _profile("3-step durable job (step writes)", "three", n // 4, 32)
    return 0
