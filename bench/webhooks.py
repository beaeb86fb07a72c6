"""jobs-webhooks benchmarks (issue 18): ``nox -s bench -- --webhooks``.

Two figures, each on the pg driver in a ``bench_webhooks`` database made fresh per run:

- **deliveries/s**: one worker process (concurrency 64 by default) delivers N queued webhooks to
  a local endpoint (a minimal ASGI app under uvicorn, in a process of its own), each attempt
  signed, SSRF-checked, POSTed and written to a :class:`PostgresWebhookLedger`. Rate = N / (the
  worker's start -> the poll that counted the last row done).
- **receiver requests/s**: our ``webhook_receiver`` under uvicorn with one worker process, the pg
  driver behind it; a load generator in another process sends M signed Standard Webhooks
  requests with distinct ids, 64 at a time. Rate = requests answered 200 / wall time; the job
  rows in the database must equal the 200s, and every other answer must be a 503 (counted).

Every number comes from a process of its own; the orchestrator only times what children report
and counts rows in the database.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import socket
import statistics
import sys
import time
from typing import Any

from pydantic import BaseModel

from bench.common import (
    Background,
    ChildFailed,
    drop_database,
    emit,
    fresh_database,
    ready,
)

DB = "bench_webhooks"
NAME = "bench.webhook"
RECEIVER = "bench.inbound"
SECRET = "whsec_" + base64.b64encode(b"bench-webhooks-secret-32-bytes!!").decode()


class DeliveryInput(BaseModel):
    """One delivery: the event's number (one endpoint serves them all)."""

    n: int


def _declare(sink: str, ledger: Any) -> Any:
    from jobs_core import Retry
    from jobs_webhooks import Endpoint, WebhookEvent, webhook

    endpoint = Endpoint(id="sink", url=sink, secrets=[SECRET], allow_private=True)
    return webhook(
        name=NAME,
        input=DeliveryInput,
        endpoint=lambda i: endpoint,
        event=lambda i: WebhookEvent(f"evt_{i.n}", "bench.tick", {"n": i.n}),
        ledger=ledger,
        tenant="none",
        idempotency_key=lambda i: str(i.n),
        retry=Retry(attempts=3, delay="1s"),
        disable_after=None,
    )


def _receiver() -> Any:
    from jobs_webhooks import verify_standard_webhook, webhook_receiver

    return webhook_receiver(
        name=RECEIVER,
        path="/hooks",
        tenant="none",
        verify=lambda inbound: verify_standard_webhook(inbound, secret=SECRET),
        handle=lambda event_id, payload: None,
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- children ----------------------------------------------------------------------------------


async def _serve(app: Any, port: int) -> None:
    import uvicorn

    config = uvicorn.Config(app, port=port, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn has no "started" event to wait on
        await asyncio.sleep(0.01)
    ready()
    await serving


async def _sink(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The delivery endpoint: read the body, answer 200 (what a fast receiver does)."""
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"11")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b'{"ok":true}'})


def serve_sink(port: int) -> None:
    """Child: the endpoint deliveries go to."""
    asyncio.run(_serve(_sink, port))


def serve_receiver(port: int, url: str) -> None:
    """Child: our receiver under uvicorn, one worker process, the pg driver installed."""
    from jobs_core import install_driver, open_driver

    install_driver(open_driver(url))
    asyncio.run(_serve(_receiver().asgi(), port))


async def migrate(url: str) -> dict[str, Any]:
    """Child: the driver's and the ledger's migrations."""
    from jobs_core import open_driver
    from jobs_webhooks import PostgresWebhookLedger

    driver = open_driver(url)
    await driver.migrate()  # type: ignore[attr-defined]
    await driver.close()
    ledger = PostgresWebhookLedger(url)
    await ledger.migrate()
    await ledger.close()
    return {}


async def fill(url: str, n: int, sink: str) -> dict[str, Any]:
    """Child: queue ``n`` deliveries."""
    from jobs_core import open_driver, use_driver
    from jobs_webhooks import memory_webhook_ledger

    hook = _declare(sink, memory_webhook_ledger())
    driver = open_driver(url)
    with use_driver(driver):
        for start in range(0, n, 10_000):
            await hook.enqueue_many(
                [DeliveryInput(n=i) for i in range(start, min(n, start + 10_000))]
            )
    await driver.close()
    return {}


async def deliver(url: str, n: int, sink: str, concurrency: int) -> dict[str, Any]:
    """Child: one worker delivering ``n`` queued webhooks; answer its rate."""
    import logging

    from jobs_core import Worker, open_driver
    from jobs_webhooks import PostgresWebhookLedger

    logging.basicConfig(level=logging.WARNING)
    ledger = PostgresWebhookLedger(url, min_size=4, max_size=16)
    hook = _declare(sink, ledger)
    driver = open_driver(url)
    worker = Worker(driver, queues=["default"], concurrency=concurrency)
    started = time.time()
    running = asyncio.create_task(worker.run())
    while True:
        stats = await driver.stats()
        live = sum(s.ready + s.delayed + s.running + s.suspended for s in stats)
        if live == 0:
            break
        await asyncio.sleep(0.05)
    finished = time.time()
    await worker.stop()
    await running
    await hook.aclose()
    await ledger.close()
    await driver.close()
    return {"value": n / (finished - started), "seconds": finished - started}


async def load(port: int, m: int, concurrency: int) -> dict[str, Any]:
    """Child: ``m`` signed requests to the receiver, ``concurrency`` at a time; answer the rate.

    A bare HTTP/1.1 client (keep-alive, one request at a time per connection) so the client's
    own cost stays far below the server's: httpx spends more per request than the receiver.
    """
    from jobs_webhooks import sign_standard_webhook

    statuses: dict[str, int] = {}
    queue = iter(range(m))

    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for i in queue:
                body = json.dumps({"id": i, "type": "bench.tick"}).encode()
                signed = sign_standard_webhook(f"in_{i}", int(time.time()), body, SECRET)
                head = "".join(f"{k}: {v}\r\n" for k, v in signed.items())
                writer.write(
                    f"POST /hooks HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {len(body)}"
                    f"\r\n{head}\r\n".encode()
                    + body
                )
                status = int((await reader.readline()).split()[1])
                length = 0
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                statuses[str(status)] = statuses.get(str(status), 0) + 1
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    return {"value": m / elapsed, "seconds": elapsed, "statuses": statuses}


async def count_rows(url: str, name: str) -> dict[str, Any]:
    """Child: how many job rows ``name`` has, and how many ledger rows say delivered."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(url.split("?")[0]) as conn:
        jobs = await (
            await conn.execute("SELECT count(*) FROM jobs.jobs WHERE name = %s", (name,))
        ).fetchone()
        delivered = await (
            await conn.execute(
                "SELECT count(*) FROM jobs.webhook_attempts WHERE outcome = 'delivered'"
            )
        ).fetchone()
    return {"jobs": jobs[0] if jobs else 0, "delivered": delivered[0] if delivered else 0}


CHILDREN = {
    "migrate": migrate,
    "fill": fill,
    "deliver": deliver,
    "load": load,
    "count": count_rows,
}


def _child(name: str, kwargs: dict[str, Any]) -> None:
    result = asyncio.new_event_loop().run_until_complete(CHILDREN[name](**kwargs))
    emit(result)
    sys.stdout.flush()
    os._exit(0)


def _run(child: str, **kwargs: Any) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.webhooks", "--child", child, json.dumps(kwargs)]
    proc = Background(argv, tag=f"webhooks-{child}")
    return proc.finish()


# --- orchestrator ------------------------------------------------------------------------------


def _deliveries(n: int, concurrency: int) -> dict[str, Any]:
    url = fresh_database(DB)
    _run("migrate", url=url)
    port = _free_port()
    sink = Background(
        [sys.executable, "-m", "bench.webhooks", "--serve-sink", str(port)], tag="webhooks-sink"
    )
    try:
        sink.wait_ready()
        target = f"http://127.0.0.1:{port}/hook"
        _run("fill", url=url, n=n, sink=target)
        result = _run("deliver", url=url, n=n, sink=target, concurrency=concurrency)
        counted = _run("count", url=url, name=NAME)
        if counted["delivered"] != n:
            raise ChildFailed(f"{counted['delivered']} of {n} deliveries recorded delivered")
        return result
    finally:
        sink.terminate()


def _receiver_rate(m: int, concurrency: int) -> dict[str, Any]:
    url = fresh_database(DB)
    _run("migrate", url=url)
    port = _free_port()
    server = Background(
        [sys.executable, "-m", "bench.webhooks", "--serve-receiver", str(port), url],
        tag="webhooks-receiver",
    )
    try:
        server.wait_ready()
        result = _run("load", port=port, m=m, concurrency=concurrency)
        counted = _run("count", url=url, name=RECEIVER)
        # A 503 (the driver's pool could not lend a connection in time) is the receiver doing
        # its job under overload: it is counted and shown, never mistaken for a stored event.
        accepted = result["statuses"].get("200", 0)
        if counted["jobs"] != accepted or accepted + result["statuses"].get("503", 0) != m:
            raise ChildFailed(f"answers {result['statuses']}, {counted['jobs']} rows of {m}")
        result["value"] = accepted / result["seconds"]
        result["unavailable"] = m - accepted
        return result
    finally:
        server.terminate()


def main(argv: list[str]) -> int:
    """Run the webhook figures; print a table (and JSON with ``--json``)."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.webhooks", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--repeat", type=int, default=3, help="repeats per figure (median)")
    parser.add_argument("--concurrency", type=int, default=64, help="worker slots / load fan-out")
    parser.add_argument("--deliveries", type=int, default=None, help="webhooks delivered")
    parser.add_argument("--requests", type=int, default=None, help="requests to the receiver")
    parser.add_argument("--json", dest="json_out", help="write every run's results here")
    args = parser.parse_args(argv)
    n = args.deliveries or (300 if args.quick else 10_000)
    m = args.requests or (300 if args.quick else 10_000)
    repeat = 1 if args.quick else args.repeat
    runs: dict[str, list[dict[str, Any]]] = {"deliveries": [], "receiver": []}
    try:
        for r in range(repeat):
            print(f"round {r + 1}/{repeat}", file=sys.stderr, flush=True)
            runs["deliveries"].append(_deliveries(n, args.concurrency))
            runs["receiver"].append(_receiver_rate(m, args.concurrency))
    finally:
        drop_database(DB)
    rows = [
        (
            f"webhook deliveries/s, one worker, concurrency {args.concurrency}, pg ({n:,})",
            "deliveries",
        ),
        (
            f"receiver requests/s, uvicorn 1 process, pg, {args.concurrency} at a time ({m:,})",
            "receiver",
        ),
    ]
    print("| figure | median | runs |")
    print("|---|---:|---|")
    for label, key in rows:
        values = [run["value"] for run in runs[key]]
        shown = ", ".join(f"{v:,.0f}" for v in values)
        print(f"| {label} | {statistics.median(values):,.0f} | {shown} |")
    refused = sum(run.get("unavailable", 0) for run in runs["receiver"])
    if refused:
        print(f"note: the receiver answered {refused} request(s) 503 (driver pool busy)")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"argv": argv, "runs": runs}, f, indent=2)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2], json.loads(sys.argv[3]))
    elif sys.argv[1:2] == ["--serve-sink"]:
        serve_sink(int(sys.argv[2]))
    elif sys.argv[1:2] == ["--serve-receiver"]:
        serve_receiver(int(sys.argv[2]), sys.argv[3])
    else:
        sys.exit(main(sys.argv[1:]))
