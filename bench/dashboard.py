"""The dashboard's jobs list over a table of 1,000,000 rows: server time at p95, and the plans.

``python -m bench.dashboard`` (or ``nox -s bench -- --dashboard``) fills a ``bench_dashboard``
database through the pg driver's ``enqueue_many`` (every row ``ready``), then spreads the rows
over states and creation times with one UPDATE (a bench-only shortcut: running a million jobs to
their ends would take the figure's whole budget). It serves the dashboard with uvicorn on
127.0.0.1 and requests list pages of several shapes: the first page, pages deep in the keyset by
``after``, pages back by ``before``, and each filter. The figure per shape is the p95 of the
``Server-Timing`` header the dashboard sends (the handler's whole time: the listing statement,
redaction and rendering), over ``--requests`` requests. Last it prints ``EXPLAIN (ANALYZE,
BUFFERS)`` of the listing statement for each filter, so a miss shows what the query does.

The target (issue 25): under 100 ms at p95 for every shape, because the listing pages by keyset
on ``(created_at, id)`` and never runs OFFSET or COUNT(*).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import statistics
import sys
import time
import uuid
from dataclasses import replace
from urllib.parse import urlencode

from bench.common import pg_admin, pg_url

DATABASE = "bench_dashboard"
SCHEMA = "jobs"
QUEUES = ("default", "billing", "mail", "reports", "imports")
NAMES = tuple(f"bench.job{i}" for i in range(10))
STATES = ("done",) * 70 + ("dead",) * 5 + ("failed",) * 5 + ("cancelled",) * 5 + ("ready",) * 15


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.dashboard", description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the table")
    parser.add_argument("--requests", type=int, default=200, help="requests per shape")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20,000 rows")
    parser.add_argument("--keep", action="store_true", help="keep the filled database")
    parser.add_argument("--reuse", action="store_true", help="reuse a database kept before")
    return parser.parse_args(argv)


async def _fill(url: str, rows: int) -> None:
    from jobs_core.types import EnqueueRequest
    from jobs_pg import PostgresDriver

    driver = await PostgresDriver.connect(url, schema=SCHEMA, min_size=1, max_size=2)
    await driver.migrate()
    rng = random.Random(25)
    base = EnqueueRequest(
        name="",
        queue="",
        input={"n": 0},
        idempotency_key="",
        tenant_id=None,
        max_attempts=3,
        id=uuid.uuid4(),
        run_id=uuid.uuid4(),
    )
    started = time.perf_counter()
    for at in range(0, rows, 1000):
        batch = [
            replace(
                base,
                name=rng.choice(NAMES),
                queue=rng.choice(QUEUES),
                input={"n": i, "token": "not-shown"},
                idempotency_key=f"k{i}",
                tenant_id=f"t{rng.randrange(100)}",
                id=uuid.uuid4(),
                run_id=uuid.uuid4(),
            )
            for i in range(at, min(rows, at + 1000))
        ]
        await driver.enqueue_many(batch)
        if at and at % 100_000 == 0:
            print(f"  filled {at:,} rows ({time.perf_counter() - started:.0f} s)", flush=True)
    await driver.close()
    states = "ARRAY[" + ",".join(f"'{s}'" for s in STATES) + "]"
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        # Spread creation over 30 days and the states over the table, as a month of history.
        conn.execute(
            f"UPDATE {SCHEMA}.jobs SET created_at = now() - random() * interval '30 days', "
            f"state = ({states})[1 + floor(random() * {len(STATES)})::int]"
        )
        conn.execute(f"VACUUM (ANALYZE) {SCHEMA}.jobs")


async def _migrate(url: str) -> None:
    """Bring a kept database to the shipped migrations (a release may have added some)."""
    from jobs_pg import PostgresDriver

    driver = await PostgresDriver.connect(url, schema=SCHEMA, min_size=1, max_size=1)
    try:
        applied = await driver.migrate()
    finally:
        await driver.close()
    if applied:
        print(f"migrated the kept database: {', '.join(applied)}", flush=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _measure(url: str, requests: int) -> dict[str, list[float]]:
    import httpx
    import uvicorn

    from jobs_core.tenancy import Actor
    from jobs_dashboard import dashboard_app
    from jobs_pg import PostgresDriver

    driver = await PostgresDriver.connect(url, schema=SCHEMA, min_size=2, max_size=4)
    app = dashboard_app(driver, auth=lambda request: Actor(id="bench"))
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="warning")
    )
    task = asyncio.create_task(server.serve())
    # uvicorn exposes only a flag for "listening", no event to wait on.
    while not server.started:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    timings: dict[str, list[float]] = {}
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:

            async def timed(shape: str, path: str) -> str:
                response = await client.get(path)
                if response.status_code != 200:
                    raise SystemExit(f"{shape}: {path} answered {response.status_code}")
                took = float(response.headers["server-timing"].split("dur=")[1])
                timings.setdefault(shape, []).append(took)
                return response.text

            def cursor(html: str, rel: str) -> str | None:
                marker = f'rel="{rel}" href="'
                if marker not in html:
                    return None
                href = html.split(marker, 1)[1].split('"', 1)[0].replace("&amp;", "&")
                return href.split("after=" if rel == "next" else "before=", 1)[1]

            day = time.strftime("%Y-%m-%d", time.gmtime(time.time() - 10 * 86400))
            shapes = {
                "first page (50 rows)": "/jobs",
                "first page (200 rows)": "/jobs?limit=200",
                "state=dead": "/jobs?state=dead",
                "dead letters, queue=billing": "/dead?queue=billing",
                "name": "/jobs?name=bench.job3",
                "tenant": "/jobs?tenant=t42",
                "tenant with no rows": "/jobs?tenant=nobody",
                "id prefix": "/jobs?id_prefix=01",
                "created range (one day)": "/jobs?"
                + urlencode({"created_from": f"{day}T00:00", "created_to": f"{day}T23:59"}),
            }
            for _ in range(requests):
                for shape, path in shapes.items():
                    await timed(shape, path)
            # Deep pages: walk `requests` pages older by keyset, then back by `before`.
            html = await timed("keyset walk (after)", "/jobs?limit=100")
            back: list[str] = []
            for _ in range(requests):
                after = cursor(html, "next")
                if after is None:
                    break
                html = await timed("keyset walk (after)", f"/jobs?limit=100&after={after}")
                back.append(after)
            for _ in range(requests):
                before = cursor(html, "prev")
                if before is None:
                    break
                html = await timed("keyset walk (before)", f"/jobs?limit=100&before={before}")
    finally:
        server.should_exit = True
        await task
        await driver.close()
    return timings


def _explain(url: str) -> None:
    import psycopg

    from jobs_pg._sql import Statements, check_schema

    text = Statements(check_schema(SCHEMA))["list_older"].decode()
    base = {
        "f_queue": None,
        "f_name": None,
        "f_state": None,
        "f_tenant": None,
        "f_prefix": None,
        "f_from": None,
        "f_to": None,
        "at": None,
        "at_id": None,
        "limit": 51,
    }
    cases = {
        "no filter": {},
        "state=dead": {"f_state": "dead"},
        "state=dead, queue=billing": {"f_state": "dead", "f_queue": "billing"},
        "tenant=t42": {"f_tenant": "t42"},
        "tenant=nobody (no row matches)": {"f_tenant": "nobody"},
    }
    with psycopg.connect(url, autocommit=True) as conn:
        for label, params in cases.items():
            plan = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS) " + text,  # type: ignore[arg-type]
                {**base, **params},
            ).fetchall()
            print(f"\n-- EXPLAIN (ANALYZE, BUFFERS) list_older, {label}")
            for (line,) in plan:
                print(line)


def main(argv: list[str]) -> None:
    """Fill (or reuse), measure, print the table and the plans."""
    args = _parse(argv)
    rows = 20_000 if args.quick else args.rows
    requests = 20 if args.quick else args.requests
    url = pg_url(DATABASE)
    if not args.reuse:
        pg_admin(f"DROP DATABASE IF EXISTS {DATABASE}")
        pg_admin(f"CREATE DATABASE {DATABASE}")
        print(f"filling {rows:,} rows into {DATABASE}", flush=True)
        started = time.perf_counter()
        asyncio.run(_fill(url, rows))
        print(f"filled in {time.perf_counter() - started:.0f} s", flush=True)
    else:
        asyncio.run(_migrate(url))
    try:
        timings = asyncio.run(_measure(url, requests))
        print(f"\n| jobs list over {rows:,} rows: shape | requests | p50 ms | p95 ms | < 100 ms |")
        print("|---|---:|---:|---:|---|")
        for shape, values in timings.items():
            p50 = statistics.median(values)
            p95 = statistics.quantiles(values, n=20)[18] if len(values) >= 20 else max(values)
            ok = "yes" if p95 < 100 else "**no**"
            print(f"| {shape} | {len(values)} | {p50:.1f} | {p95:.1f} | {ok} |")
        _explain(url)
    finally:
        if not args.keep:
            pg_admin(f"DROP DATABASE IF EXISTS {DATABASE}")


if __name__ == "__main__":
    main(sys.argv[1:])
