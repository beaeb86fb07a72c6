"""Run the benchmarks: ``python -m bench`` (or ``nox -s bench -- ARGS``).

Examples:
    python -m bench --quick                      # smoke run, memory + every driver that imports
    python -m bench --drivers memory,pg --repeat 3 --markdown
    nox -s bench -- --peers --markdown --json bench.json
    python -m bench --rss --drivers memory,pg    # worker RSS after 100k and 1M jobs (long)
    python -m bench --profile                    # pyinstrument on the memory hot paths
    python -m bench --webhooks --quick           # jobs-webhooks' figures (bench/webhooks.py)
    python -m bench --import-export              # jobs-import-export: RSS and throughput
    python -m bench --import-export --instructions  # ... and instructions per row (valgrind)
    python -m bench --dashboard                  # the dashboard's jobs list over 1M pg rows
    python -m bench --backfill --quick           # a killed pass, the throttle (bench/backfill.py)
    python -m bench --timers [--quick]           # lateness of 200 delayed jobs (bench/timers.py)
    python -m bench --soak 30 --private-server   # enqueue + drain + retention for 30 min (soak.py)
    python -m bench --migrate-online [--reuse]   # enqueue latency during an online migration
    python -m bench --retained [--quick]         # claim throughput with 10M settled rows kept
    python -m bench --cluster [--quick]          # 3-master Redis Cluster vs one Redis (cluster.py)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import sys
import time
from typing import Any

from bench import report, suite
from bench.suite import Results, Sizes

DRIVER_PACKAGES = {"pg": "jobs_pg", "redis": "jobs_redis"}


def _available(driver: str) -> str | None:
    """Answer why ``driver`` cannot run here, or ``None`` when it can."""
    if driver == "memory":
        return None
    package = DRIVER_PACKAGES.get(driver)
    if package is None:
        return f"unknown driver {driver!r} (memory, pg, redis)"
    if importlib.util.find_spec(package) is None:
        return f"{package} is not installed (packages/jobs-{driver} has not landed?)"
    from importlib.metadata import entry_points

    schemes = {ep.name for ep in entry_points(group="jobs.drivers")}
    scheme = "postgresql" if driver == "pg" else "redis"
    if scheme not in schemes:
        return f"{package} registers no '{scheme}' entry point in jobs.drivers"
    return None


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--drivers", default="memory,pg,redis", help="ours to run (default all)")
    parser.add_argument("--peers", action="store_true", help="also run the peer libraries")
    parser.add_argument("--peer", action="append", default=[], help="only these peers")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--repeat", type=int, default=3, help="repeats per figure (median)")
    parser.add_argument("--concurrency", type=int, default=64, help="our worker's slots")
    parser.add_argument("--figures", default="", help="comma list to run a subset")
    parser.add_argument("--no-floors", action="store_true", help="skip the floors")
    parser.add_argument("--json", dest="json_out", help="write every run's results here")
    parser.add_argument("--markdown", action="store_true", help="print the README block")
    parser.add_argument("--rss", action="store_true", help="worker RSS after 100k and 1M jobs")
    parser.add_argument(
        "--rss-checkpoints", default="100000,1000000", help="job counts to sample RSS at"
    )
    parser.add_argument("--profile", action="store_true", help="profile the memory hot paths")
    parser.add_argument(
        "--import-export",
        action="store_true",
        help="jobs-import-export: worker RSS importing a 200 MB CSV and exporting 2M rows, "
        "import throughput against csv.reader + pydantic",
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="with --import-export: also count instructions per row under valgrind (callgrind)",
    )
    parser.add_argument(
        "--dashboard", action="store_true", help="the dashboard's jobs list over 1M pg rows"
    )
    return parser.parse_args(argv)


PG_ONLY = {"cli-defaults"}
"""Figures whose target is set on pg alone (the CLI at its defaults against ``pgq run``)."""
ALL_FIGURES = (
    "enqueue-single",
    "enqueue-batch",
    "processing",
    "cli-defaults",
    "durable",
    "pickup",
    "log-cost",
)


def main(argv: list[str]) -> int:
    """Run what ``argv`` asks; answer the exit code."""
    if "--webhooks" in argv:
        from bench.webhooks import main as webhooks_main

        return webhooks_main([a for a in argv if a != "--webhooks"])
    if "--soak" in argv:
        from bench.soak import main as soak_main

        return soak_main([a for a in argv if a != "--soak"])
    if "--timers" in argv:
        from bench.timers import main as timers_main

        return timers_main([a for a in argv if a != "--timers"])
    if "--retained" in argv:
        from bench.retained import main as retained_main

        return retained_main([a for a in argv if a != "--retained"])
    if "--migrate-online" in argv:
        from bench.migrate_online import main as migrate_online_main

        return migrate_online_main([a for a in argv if a != "--migrate-online"])
    if "--cluster" in argv:
        from bench.cluster import main as cluster_main

        return cluster_main([a for a in argv if a != "--cluster"])
    if "--backfill" in argv:
        from bench.backfill import main as backfill_main

        return backfill_main([a for a in argv if a != "--backfill"])
    args = _parse(argv)
    if args.profile:
        from bench.profile import main as profile_main

        return profile_main(quick=args.quick)
    if args.import_export:
        from bench.import_export import main as import_export_main

        return import_export_main(
            quick=args.quick,
            repeat=args.repeat,
            markdown=args.markdown,
            instructions=args.instructions,
        )
    if args.dashboard:
        from bench.dashboard import main as dashboard_main

        dashboard_main(["--quick"] if args.quick else [])
        return 0
    sizes = Sizes.quick() if args.quick else Sizes.full()
    results = Results()
    drivers = []
    for driver in [d.strip() for d in args.drivers.split(",") if d.strip()]:
        why = _available(driver)
        if why is None:
            drivers.append(driver)
        else:
            results.notes.append(f"ours {driver}: not run: {why}")
            print(f"skip ours {driver}: {why}", file=sys.stderr)
    peers: dict[str, Any] = {}
    if args.peers:
        from bench.peers import available_peers

        peers, why_not = available_peers(args.peer)
        for line in why_not:
            results.notes.append(line)
            print(f"skip {line}", file=sys.stderr)
    figures = [f for f in (args.figures.split(",") if args.figures else ALL_FIGURES) if f]
    started = time.monotonic()
    if args.rss:
        _rss(args, drivers, results)
    else:
        _figures(args, sizes, drivers, peers, figures, results)
    report.derive(results)
    for entry in results.figures.values():
        if entry.error:
            results.notes.append(
                f"{entry.figure} {entry.system}: {entry.failures} repeat(s) failed "
                f"({len(entry.runs)} succeeded): {entry.error}"
            )
    peer_backends = {name: peer.BACKEND for name, peer in peers.items()}
    settings = _settings(args, sizes, peers, time.monotonic() - started)
    facts = report.machine()
    print("\n".join(report.table(results, peer_backends)))
    for line in report.rss_lines(results):
        print(line)
    for note in results.notes:
        print(f"note: {note}")
    if args.markdown:
        print("\n<!-- bench markdown: paste verbatim -->")
        print(report.markdown(results, peer_backends, facts, settings))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(
                {
                    "machine": facts,
                    "settings": settings,
                    "argv": argv,
                    "figures": [e.as_json() for e in results.figures.values()],
                    "notes": results.notes,
                },
                f,
                indent=2,
            )
    # A repeat that failed is reported in the notes; the run fails only when a figure got none.
    failed = [e for e in results.figures.values() if e.error and not e.runs]
    return 1 if failed else 0


def _figures(
    args: argparse.Namespace,
    sizes: Sizes,
    drivers: list[str],
    peers: dict[str, Any],
    figures: list[str],
    results: Results,
) -> None:
    conc = args.concurrency
    ours_runs = {
        "enqueue-single": lambda d: suite.ours_enqueue_single(d, sizes),
        "enqueue-batch": lambda d: suite.ours_enqueue_many(d, sizes),
        "processing": lambda d: suite.ours_drain(d, "noop", sizes.processing, conc),
        "cli-defaults": lambda d: suite.ours_cli_defaults(d, sizes),
        "durable": lambda d: suite.ours_drain(d, "three", sizes.durable, conc),
        "pickup": lambda d: suite.ours_pickup(d, sizes, conc),
        "log-cost": lambda d: suite.ours_log_cost(d, sizes, conc),
    }
    try:
        for rep in range(args.repeat):
            print(f"round {rep + 1}/{args.repeat}", file=sys.stderr, flush=True)
            for figure in figures:
                for driver in drivers:
                    if figure in PG_ONLY and driver != "pg":
                        continue
                    results.record(
                        figure, f"ours:{driver}", lambda f=figure, d=driver: ours_runs[f](d)
                    )
                for name, peer in peers.items():
                    run = peer.FIGURES.get(figure)
                    if run is not None:
                        results.record(figure, name, lambda r=run: r(sizes))
            if not args.no_floors:
                floors = [("pg-serial", sizes.floor_serial), ("pg-batch", sizes.floor_batch)]
                floors += [("pg-insert", sizes.single), ("pg-insert-batch", sizes.batch_total)]
                floors += [
                    ("redis-plain", sizes.floor_redis_plain),
                    ("redis-pipelined", sizes.floor_redis_pipelined),
                ]
                for name, n in floors:
                    results.record(name, "floor", lambda name=name, n=n: suite.floor(name, n))
    finally:
        suite.cleanup_ours(drivers)
        if not args.no_floors:
            suite.cleanup_floors()
        for peer in peers.values():
            peer.cleanup()


def _rss(args: argparse.Namespace, drivers: list[str], results: Results) -> None:
    checkpoints = [int(x) for x in args.rss_checkpoints.split(",")]
    total = max(checkpoints)
    try:
        for driver in [d for d in drivers if d in ("memory", "pg")]:
            # Estimate first: a 10k drain gives the rate, the rate gives the time.
            probe = suite.ours_drain(driver, "noop", 10_000, args.concurrency)
            fill = 0.0
            if driver != "memory":
                fill = total / 40_000  # enqueue_many runs well above this on pg here
            estimate = total / probe["value"] + fill
            print(
                f"rss {driver}: {probe['value']:,.0f} jobs/s -> about {estimate / 60:.1f} min "
                f"for {total:,} jobs",
                file=sys.stderr,
                flush=True,
            )
            results.notes.append(
                f"rss {driver}: estimated {estimate / 60:.1f} min for {total:,} jobs at "
                f"{probe['value']:,.0f} jobs/s (concurrency {args.concurrency})"
            )
            results.record(
                "rss",
                f"ours:{driver}",
                lambda d=driver: suite.ours_rss(d, checkpoints, args.concurrency),
            )
    finally:
        suite.cleanup_ours(drivers)


def _settings(
    args: argparse.Namespace, sizes: Sizes, peers: dict[str, Any], seconds: float
) -> list[str]:
    command = "nox -s bench -- " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    out = [
        f"Command: `{command.strip()}` ({seconds / 60:.0f} min); medians of {args.repeat} "
        "repeats, every figure in a fresh process, systems interleaved per round.",
        f"Sizes: single enqueue {sizes.single:,}; batch enqueue {sizes.batch_total:,} in "
        f"batches of 1,000; processing {sizes.processing:,} no-op jobs; durable "
        f"{sizes.durable:,} runs of 3 steps; pickup {sizes.pickup} probes 200 ms apart.",
        f"Ours: one worker process, concurrency={args.concurrency} (a claim takes at most "
        f"{(args.concurrency + 1) // 2} rows), log level WARNING; the "
        "enqueuer is another process (memory: the same process, another thread for pickup).",
        "Processing rate = jobs / (first body start → the poll that counted the last row done "
        "in the backend). Outcomes are counted in the backend, never read from logs. The polls "
        "(every 10 ms) share one kept-open connection per database; where a cheap probe says "
        "whether anything is left (our live-row indexes, pgqueuer's queue table, arq's and "
        "dramatiq's queues) the count runs only once it says nothing is.",
    ]
    for name, peer in peers.items():
        out.append(f"{name} {peer.VERSION}: {peer.SETTINGS}")
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
