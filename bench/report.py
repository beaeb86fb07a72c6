"""The one table: figure | ours (memory / pg / redis) | peer | ratio, then the floors.

The markdown form is written by the harness so it can be pasted into README.md verbatim.
"""

from __future__ import annotations

import os
import platform
import subprocess
from typing import Any

from bench.suite import Results

FIGURES = [
    ("enqueue-single", "enqueue, one call at a time (jobs/s)"),
    ("enqueue-batch", "enqueue in batches of 1,000 (jobs/s)"),
    ("processing", "no-op jobs drained by one worker process (jobs/s)"),
    ("cli-defaults", "no-op jobs drained by the worker CLI at its defaults (jobs/s)"),
    ("durable", "3-step durable runs, one worker process (runs/s)"),
    ("step-overhead", "per-step overhead vs a no-op job (ms, lower is better)"),
    ("pickup", "pickup latency p50 / p95 / max (ms, lower is better)"),
    ("commits-per-job", "pg commits per no-op job, worker side (lower is better)"),
    ("commits-per-run", "pg commits per 3-step run, worker side (lower is better)"),
    ("trips-per-job", "redis round trips per no-op job, worker side (lower is better)"),
    ("trips-per-run", "redis round trips per 3-step run, worker side (lower is better)"),
    ("log-cost", "no-op drain at the CLI's default log level (info, text) / at warning"),
    ("log-cost-json", "no-op drain at info with --log-format json / at warning"),
]
RATIOS = {"log-cost", "log-cost-json"}
"""Rows whose figure is a ratio within one system (1.00: the log lines cost nothing)."""
OURS = ("memory", "pg", "redis")
FLOORS = [
    ("pg-serial", "psycopg INSERT + UPDATE per job, autocommit", "pg", "processing"),
    ("pg-batch", "psycopg INSERT + UPDATE, 1,000 rows per statement", "pg", "processing"),
    ("pg-insert", "psycopg one INSERT per call, autocommit (key only)", "pg", "enqueue-single"),
    ("pg-insert-batch", "psycopg INSERT of 1,000 rows per call (key only)", "pg", "enqueue-batch"),
    ("redis-plain", "redis-py LPUSH + RPOP per job", "redis", "processing"),
    ("redis-pipelined", "redis-py LPUSH + RPOP, 1,000 pairs per pipeline", "redis", "processing"),
]
"""Each floor: (name, label, the backend, the figure of ours (and the peers) set against it).
The insert floors are the ceiling of an enqueue: one durable commit and one round trip a call,
no index but the key, no queue logic."""
LOWER_IS_BETTER = {
    "step-overhead",
    "pickup",
    "commits-per-job",
    "commits-per-run",
    "trips-per-job",
    "trips-per-run",
}
# Derived rows: (figure it is read from, the row, the key in that figure's runs).
PER_JOB = [
    ("processing", "commits-per-job", "commits_per_job"),
    ("durable", "commits-per-run", "commits_per_job"),
    ("processing", "trips-per-job", "round_trips_per_job"),
    ("durable", "trips-per-run", "round_trips_per_job"),
    ("log-cost", "log-cost-json", "json"),
]


def derive(results: Results) -> None:
    """Add the derived rows for each system.

    Per-step overhead is (1/durable rate - 1/no-op rate) / 3, in ms; the per-job rows copy the
    commits and round trips the processing and durable figures counted.
    """
    systems = {system for (_, system) in results.figures}
    for system in systems:
        durable = results.figures.get(("durable", system))
        noop = results.figures.get(("processing", system))
        if durable is None or noop is None:
            continue
        d, p = durable.value(), noop.value()
        if d and p:
            entry = results.get("step-overhead", system)
            entry.runs = [{"value": (1 / d - 1 / p) / 3 * 1000, "unit": "ms"}]
    for source, target, key in PER_JOB:
        for system in systems:
            found = results.figures.get((source, system))
            if found is None:
                continue
            count = found.value(key)
            if count is not None:
                results.get(target, system).runs = [{"value": count, "unit": key}]


def _fmt(results: Results, figure: str, system: str) -> str:
    entry = results.figures.get((figure, system))
    if entry is None:
        return ""
    if entry.error and not entry.runs:
        return "failed"
    if figure == "pickup":
        p50, p95, top = entry.value("p50"), entry.value("p95"), entry.value("max")
        if p50 is None or p95 is None or top is None:
            return ""
        return f"{p50:.1f} / {p95:.1f} / {top:.1f}"
    value = entry.value()
    if value is None:
        return ""
    return f"{value:.2f}" if figure in LOWER_IS_BETTER | RATIOS else f"{value:,.0f}"


def _key(results: Results, figure: str, system: str) -> float | None:
    entry = results.figures.get((figure, system))
    if entry is None:
        return None
    return entry.value("p50") if figure == "pickup" else entry.value()


def _ratio(results: Results, figure: str, ours: str, peer: str) -> str:
    a, b = _key(results, figure, f"ours:{ours}"), _key(results, figure, peer)
    if not a or not b:
        return ""
    return f"{a / b:.2f}× ({ours})"


def table(results: Results, peers: dict[str, str]) -> list[str]:
    """Answer the markdown table lines; ``peers`` maps each peer to its backend (pg/redis)."""
    lines = [
        "| figure | ours memory | ours pg | ours redis | peer | peer figure | ratio ours/peer |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    for figure, label in FIGURES:
        ours = [_fmt(results, figure, f"ours:{d}") for d in OURS]
        rows = [
            (peer, backend)
            for peer, backend in peers.items()
            if (figure, peer) in results.figures and _fmt(results, figure, peer)
        ]
        if not any(ours) and not rows:
            continue
        if not rows:
            lines.append(f"| {label} | {' | '.join(ours)} | | | |")
        for index, (peer, backend) in enumerate(rows):
            shown = ours if index == 0 else ["", "", ""]
            name = label if index == 0 else ""
            lines.append(
                f"| {name} | {' | '.join(shown)} | {peer} ({backend}) | "
                f"{_fmt(results, figure, peer)} | {_ratio(results, figure, backend, peer)} |"
            )
    lines.append("")
    lines.append("| floor (no queue logic) | jobs/s | against | ours / floor | peers / floor |")
    lines.append("|---|---:|---|---:|---|")
    for name, label, backend, figure in FLOORS:
        floor = _key(results, name, "floor")
        if floor is None:
            continue
        ours = _key(results, figure, f"ours:{backend}")
        ratio = f"{ours / floor:.2f}× ({backend})" if ours else ""
        shares = [
            f"{peer} {value / floor:.2f}×"
            for peer, peer_backend in peers.items()
            if peer_backend == backend and (value := _key(results, figure, peer))
        ]
        lines.append(f"| {label} | {floor:,.0f} | {figure} | {ratio} | {', '.join(shares)} |")
    return lines


def rss_lines(results: Results) -> list[str]:
    """Answer the RSS table lines (empty without ``--rss``)."""
    out: list[str] = []
    for (figure, system), entry in sorted(results.figures.items()):
        if figure != "rss" or not entry.runs:
            continue
        run = entry.runs[0]
        marks = run["checkpoints"]
        keys = sorted(marks, key=int)
        first, last = marks[keys[0]]["rss_kib"], marks[keys[-1]]["rss_kib"]
        if not out:
            out += [
                "| worker RSS | " + " | ".join(f"after {int(k):,}" for k in keys) + " | growth |"
            ]
            out += ["|---|" + "---:|" * (len(keys) + 1)]
        cells = " | ".join(f"{marks[k]['rss_kib'] / 1024:,.0f} MiB" for k in keys)
        out.append(f"| {system} | {cells} | {(last - first) / first * 100:+.1f}% |")
    return out


def _cmd(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return "?"


def machine() -> dict[str, Any]:
    """Answer the facts about this machine a reader needs to weigh the figures."""
    mem_kib = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    pg = "?"
    redis_version = "?"
    try:
        import psycopg

        from bench.common import pg_url

        with psycopg.connect(pg_url("postgres")) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            pg = str(row[0]) if row else "?"
    except Exception:
        pass
    try:
        import redis

        from bench.common import REDIS_HOST, REDIS_PORT

        client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT)
        redis_version = str(client.info("server")["redis_version"])
        client.close()
    except Exception:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "ram_gib": round(mem_kib / 1024 / 1024, 1),
        "postgresql": pg,
        "redis": redis_version,
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def markdown(
    results: Results, peers: dict[str, str], facts: dict[str, Any], settings: list[str]
) -> str:
    """Answer the README block: machine, settings, the table, RSS and notes."""
    out = [
        f"Machine: {facts['nproc']} cores ({facts['cpu']}), {facts['ram_gib']} GiB RAM, "
        f"PostgreSQL {facts['postgresql']}, Redis {facts['redis']}, Python {facts['python']}.",
        "",
        *[f"- {s}" for s in settings],
        "",
        *table(results, peers),
    ]
    rss = rss_lines(results)
    if rss:
        out += ["", *rss]
    if results.notes:
        out += ["", *[f"- {n}" for n in results.notes]]
    return "\n".join(out) + "\n"
