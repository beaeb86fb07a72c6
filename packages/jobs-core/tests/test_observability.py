"""What operators watch: the worker registry, Prometheus metrics scraped over HTTP, OpenTelemetry
spans across enqueue and attempt, and structured logs."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from jobs_core import JobRegistry, Retry, Worker, introspect, job, use_driver
from jobs_core._tracing import current_traceparent, tracing_enabled
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.metrics import JobsMetrics
from jobs_core.testing import ManualClock, run_jobs
from jobs_core.types import ClaimRequest, JobState


class Item(BaseModel):
    key: str


def item_job(registry: JobRegistry, name: str, **options: Any) -> Any:
    return job(
        input=Item,
        idempotency_key=lambda i: f"{name}:{i.key}",
        tenant="none",
        name=name,
        registry=registry,
        **options,
    )


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


# --- the worker registry ---------------------------------------------------------------------


async def test_a_worker_registers_beats_shows_its_jobs_and_leaves(registry: JobRegistry) -> None:
    driver = MemoryDriver()
    started = asyncio.Event()
    release = asyncio.Event()

    @item_job(registry, "hold")
    async def hold(input: Item, step: Any, ctx: Any) -> None:
        started.set()
        await release.wait()

    with use_driver(driver):
        queued = await hold.enqueue(Item(key="a"))
    worker = Worker(
        driver,
        queues=["default", "other"],
        concurrency=3,
        visibility_timeout="300ms",
        poll_interval="5ms",
        registry=registry,
        build="shop-1.4.2",
    )
    running = asyncio.create_task(worker.run())
    await started.wait()

    async def holding() -> bool:
        rows = await introspect.workers(driver)
        return len(rows) == 1 and rows[0].in_flight == (queued.id,)

    await eventually(holding)  # the next beat (a third of the lease) lists the held job
    [row] = await introspect.workers(driver)
    assert (row.id, row.build, row.queues, row.slots) == (
        worker.id,
        "shop-1.4.2",
        ("default", "other"),
        6,
    )
    assert row.host and row.started_at <= row.last_heartbeat and row.draining_at is None
    first_beat = row.last_heartbeat

    async def beat_again() -> bool:
        return (await introspect.workers(driver))[0].last_heartbeat > first_beat

    await eventually(beat_again)
    release.set()
    await worker.stop()
    await running
    assert await introspect.workers(driver) == []  # a clean stop removes the row


async def test_a_draining_worker_says_so_until_it_leaves(registry: JobRegistry) -> None:
    driver = MemoryDriver()
    started = asyncio.Event()
    release = asyncio.Event()

    @item_job(registry, "slow")
    async def slow(input: Item, step: Any, ctx: Any) -> None:
        started.set()
        await release.wait()  # ignores the drain's cancel for a while

    with use_driver(driver):
        await slow.enqueue(Item(key="a"))
    worker = Worker(driver, poll_interval="5ms", registry=registry, drain_timeout="10s")
    running = asyncio.create_task(worker.run())
    await started.wait()
    draining = asyncio.create_task(worker.drain())

    async def flagged() -> bool:
        rows = await introspect.workers(driver)
        return bool(rows) and rows[0].draining_at is not None

    await eventually(flagged)
    release.set()
    await draining
    await running
    assert await introspect.workers(driver) == []


# --- metrics ---------------------------------------------------------------------------------


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return (name, tuple(sorted(labels.items())))


async def test_metrics_scraped_over_http_after_a_scripted_run(registry: JobRegistry) -> None:
    clock = ManualClock()
    driver = MemoryDriver(clock)
    stuck = asyncio.Event()

    @item_job(registry, "ok")
    async def ok(input: Item, step: Any, ctx: Any) -> None: ...

    @item_job(registry, "drop", retry=Retry(attempts=1, dead_letter=False))
    async def drop(input: Item, step: Any, ctx: Any) -> None:
        raise RuntimeError("dropped for good")

    @item_job(registry, "bury", retry=Retry(attempts=1))
    async def bury(input: Item, step: Any, ctx: Any) -> None:
        raise RuntimeError("dead for good")

    @item_job(registry, "stuck")
    async def hang(input: Item, step: Any, ctx: Any) -> None:
        stuck.set()
        await ctx.cancel.wait()
        ctx.cancel.raise_if_cancelled()

    @item_job(registry, "later", queue="backlog")
    async def later(input: Item, step: Any, ctx: Any) -> None: ...

    with use_driver(driver):
        await ok.enqueue_many([Item(key="1"), Item(key="2")])
        await drop.enqueue(Item(key="1"))
        await bury.enqueue(Item(key="1"))
        await later.enqueue_many([Item(key=str(i)) for i in range(3)])  # no worker serves it

    metrics = JobsMetrics()
    server = metrics.serve(0)
    worker = Worker(
        driver,
        queues=["default"],
        concurrency=4,
        visibility_timeout="300ms",
        poll_interval="5ms",
        idle_poll_max="20ms",
        registry=registry,
        clock=clock,
        metrics=metrics,
        metrics_interval="20ms",
    )
    running = asyncio.create_task(worker.run())
    try:

        async def settled() -> bool:
            stats = {s.queue: s for s in await driver.stats()}["default"]
            return (stats.done, stats.failed, stats.dead) == (2, 1, 1)

        await eventually(settled)
        with use_driver(driver):
            await hang.enqueue(Item(key="1"))
        await stuck.wait()
        # The lease lapses on the driver's clock and another worker takes the row over.
        clock.advance("1s")
        [stolen] = await driver.claim(ClaimRequest(["default"], 1, 60_000, "thief"))
        assert stolen.name == "stuck"

        expected = {
            sample("jobs_total", queue="default", outcome="completed"): 2,
            sample("jobs_total", queue="default", outcome="dropped"): 1,
            sample("jobs_total", queue="default", outcome="dead-lettered"): 1,
            sample("jobs_total", queue="default", outcome="lost"): 1,
            sample("job_leases_lost_total", queue="default"): 1,
            sample("job_duration_seconds_count", queue="default", job="ok"): 2,
            sample("queue_depth", queue="backlog"): 3,
            sample("queue_demand", queue="backlog"): 3,
            sample("queue_oldest_ready_seconds", queue="backlog"): 1.0,
            sample("queue_dead_jobs", queue="default"): 1,
            sample("job_worker_capacity"): 4,
            sample("job_worker_in_flight"): 0,
        }

        async def scraped() -> bool:
            got = await asyncio.to_thread(scrape, server.port)
            return all(got.get(key) == value for key, value in expected.items())

        await eventually(scraped)
        await worker.drain()
        await running
        # A draining worker publishes no demand; the backlog itself is still there.
        after = await asyncio.to_thread(scrape, server.port)
        assert after[sample("queue_demand", queue="backlog")] == 0
        assert after[sample("queue_depth", queue="backlog")] == 3
        assert after[sample("job_worker_capacity")] == 0  # the worker is gone
    finally:
        if not running.done():
            await worker.stop()
            await running
        server.close()


def test_two_metrics_objects_do_not_share_series() -> None:
    first, second = JobsMetrics(), JobsMetrics()
    first.attempt("q", "j", "completed", 0.2)
    assert first.registry.get_sample_value("jobs_total", {"queue": "q", "outcome": "completed"})
    assert (
        second.registry.get_sample_value("jobs_total", {"queue": "q", "outcome": "completed"})
        is None
    )
    second.attempt("q", "j", "deferred", 5.0)  # the body never ran: counted, not timed
    assert (
        second.registry.get_sample_value("job_duration_seconds_count", {"queue": "q", "job": "j"})
        is None
    )
    assert second.registry.get_sample_value(
        "jobs_total", {"queue": "q", "outcome": "deferred"}
    ) == (1.0)


# --- tracing ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()


async def test_the_job_span_is_a_child_of_the_enqueuing_span(
    spans: InMemorySpanExporter, driver: MemoryDriver, registry: JobRegistry
) -> None:
    spans.clear()

    @item_job(registry, "child")
    async def child(input: Item, step: Any, ctx: Any) -> None: ...

    @item_job(registry, "parent")
    async def parent(input: Item, step: Any, ctx: Any) -> None:
        # Enqueued from inside the job's span, so the child job joins the same trace.
        await child.enqueue(Item(key=input.key))

    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("POST /checkout") as request:
        queued = await parent.enqueue(Item(key="a"))
    await run_jobs(driver, registry=registry)

    finished = {span.name: span for span in spans.get_finished_spans()}
    job_span = finished["job parent"]
    child_span = finished["job child"]
    trace_id = request.get_span_context().trace_id
    assert job_span.context.trace_id == trace_id
    assert job_span.parent is not None
    assert job_span.parent.span_id == request.get_span_context().span_id
    assert child_span.context.trace_id == trace_id
    assert child_span.parent is not None and child_span.parent.span_id == job_span.context.span_id
    assert job_span.kind is trace.SpanKind.CONSUMER
    assert job_span.attributes is not None
    assert job_span.attributes["jobs.job.id"] == str(queued.id)
    assert job_span.attributes["jobs.outcome"] == "completed"
    row = (await introspect.get_job(driver, queued.id, registry=registry)).job
    assert row.traceparent is not None and f"{trace_id:032x}" in row.traceparent


async def test_no_current_span_stamps_nothing_and_a_failure_marks_the_span(
    spans: InMemorySpanExporter, driver: MemoryDriver, registry: JobRegistry
) -> None:
    spans.clear()

    @item_job(registry, "fails", retry=Retry(attempts=1))
    async def fails(input: Item, step: Any, ctx: Any) -> None:
        raise RuntimeError("no")

    assert tracing_enabled() and current_traceparent() is None
    queued = await fails.enqueue(Item(key="a"))
    await run_jobs(driver, registry=registry)

    assert (await driver.introspect.get(queued.id)).traceparent is None  # type: ignore[union-attr]
    [span] = [s for s in spans.get_finished_spans() if s.name == "job fails"]
    assert span.parent is None  # a trace of its own
    assert span.status.status_code is trace.StatusCode.ERROR


def _script_lines(script: str, count: int) -> list[str]:
    """Run ``script`` in a fresh interpreter (no ``OTEL_*`` variables); answer its first lines."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")[:count]


ABSENT = """
import asyncio, importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"{name} is blocked for this test")
        return None

sys.meta_path.insert(0, Block())

from pydantic import BaseModel
from jobs_core import job, use_driver
from jobs_core._tracing import current_traceparent, tracing_enabled
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.testing import run_jobs

class Item(BaseModel):
    key: str

@job(input=Item, idempotency_key=lambda i: i.key, tenant="none", name="plain")
async def plain(input, step, ctx):
    await step.run("s", lambda: 1)

async def main():
    driver = MemoryDriver()
    with use_driver(driver):
        queued = await plain.enqueue(Item(key="a"))
        await run_jobs(driver)
        row = await driver.introspect.get(queued.id)
    print(tracing_enabled(), current_traceparent(), row.traceparent, row.state.value)
    print("opentelemetry" in sys.modules)

asyncio.run(main())
"""


def test_without_opentelemetry_the_tracing_paths_are_inert() -> None:
    assert _script_lines(ABSENT, 2) == ["False None None done", "False"]


API_ONLY = """
import asyncio
from opentelemetry import context, trace
from pydantic import BaseModel
from jobs_core import JobFilter, job, use_driver
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.testing import run_jobs

class Item(BaseModel):
    key: str

@job(input=Item, idempotency_key=lambda i: i.key, tenant="none", name="child")
async def child(input, step, ctx):
    pass

@job(input=Item, idempotency_key=lambda i: i.key, tenant="none", name="parent")
async def parent(input, step, ctx):
    await child.enqueue(Item(key="child-of-" + input.key))

async def main():
    driver = MemoryDriver()
    remote = trace.NonRecordingSpan(trace.SpanContext(
        trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736, span_id=0x00F067AA0BA902B7,
        is_remote=True, trace_flags=trace.TraceFlags(1),
    ))
    with use_driver(driver):
        token = context.attach(trace.set_span_in_context(remote))
        traced = await parent.enqueue(Item(key="a"))
        context.detach(token)
        untraced = await parent.enqueue(Item(key="b"))
        await run_jobs(driver)
        page = await driver.introspect.list(JobFilter())
        rows = {r.idempotency_key: r for r in page.rows}
    print(type(trace.get_tracer_provider()).__name__)
    print(rows["a"].traceparent == rows["child-of-a"].traceparent, rows["a"].traceparent)
    print(rows["b"].traceparent, rows["child-of-b"].traceparent)

asyncio.run(main())
"""


def test_with_the_api_but_no_sdk_a_row_traceparent_still_reaches_the_body() -> None:
    # No span records without an SDK, but the row's trace context must still be current in the
    # body so its enqueues join that trace; a row without one has none to pass on.
    assert _script_lines(API_ONLY, 3) == [
        "ProxyTracerProvider",
        "True 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "None None",
    ]


SDK_LATER = """
import asyncio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel
from jobs_core import job, use_driver
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.testing import run_jobs

class Item(BaseModel):
    key: str

@job(input=Item, idempotency_key=lambda i: i.key, tenant="none", name="plain")
async def plain(input, step, ctx):
    pass

async def main():
    driver = MemoryDriver()
    exporter = InMemorySpanExporter()
    with use_driver(driver):
        await plain.enqueue(Item(key="before"))
        await run_jobs(driver)
        print(len(exporter.get_finished_spans()))
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        await plain.enqueue(Item(key="after"))
        await run_jobs(driver)
    print([span.name for span in exporter.get_finished_spans()])

asyncio.run(main())
"""


def test_an_sdk_installed_after_jobs_ran_gets_the_spans_of_the_next_ones() -> None:
    # Without an SDK a row without a traceparent opens no span (the check reads the API's
    # installed-provider global, not the environment, at each attempt); the first attempt after
    # the process installs one does.
    assert _script_lines(SDK_LATER, 2) == ["0", "['job plain']"]


# --- logs ------------------------------------------------------------------------------------


async def test_ctx_log_merges_the_body_extra_with_the_bound_ids(
    driver: MemoryDriver, registry: JobRegistry, caplog: Any
) -> None:
    @item_job(registry, "chatty")
    async def chatty(input: Item, step: Any, ctx: Any) -> None:
        ctx.log.info("sent", extra={"recipient_count": 3, "job_id": "spoofed"})

    queued = await chatty.enqueue(Item(key="a"))
    with caplog.at_level(logging.INFO, logger="jobs.job.chatty"):
        await run_jobs(driver, registry=registry)

    [record] = [r for r in caplog.records if r.getMessage() == "sent"]
    assert record.recipient_count == 3  # type: ignore[attr-defined]
    assert record.job_id == str(queued.id)  # type: ignore[attr-defined]
    assert record.run_id == str(queued.run_id)  # type: ignore[attr-defined]
    assert record.attempt == 1  # type: ignore[attr-defined]


async def test_no_log_record_carries_the_payload(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry, caplog: Any
) -> None:
    marker = "payload-marker-7f3a"

    @item_job(registry, "secretive", retry=Retry(attempts=2, delay="1ms", jitter=False))
    async def secretive(input: Item, step: Any, ctx: Any) -> None:
        raise RuntimeError("declined")

    with caplog.at_level(logging.DEBUG):
        queued = await secretive.enqueue(Item(key=marker))
        await run_jobs(driver, registry=registry, clock=clock)
        assert (await introspect.get_job(driver, queued.id)).job.state is JobState.DEAD
        await introspect.requeue(driver, queued.id)
        await introspect.cancel(driver, queued.id)
        await introspect.remove(driver, queued.id)

    events = {getattr(r, "event", None) for r in caplog.records}
    assert {"jobs.attempt.settled", "jobs.operator.requeued", "jobs.operator.removed"} <= events
    for record in caplog.records:
        assert marker not in record.getMessage()
        assert all(marker not in str(value) for value in vars(record).values())
    assert (await driver.introspect.get(queued.id)) is None


def test_no_created_series_are_exposed_in_either_format() -> None:
    """prometheus-client's ``*_created`` timestamps are left out, in our registry or an app's."""
    from prometheus_client import CollectorRegistry, Counter, generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

    own = JobsMetrics()
    app_registry = CollectorRegistry()
    app_counter = Counter("app_requests", "The app's own counter.", registry=app_registry)
    app_counter.inc()
    shared = JobsMetrics(app_registry)
    for metrics in (own, shared):
        metrics.attempt("q", "j", "completed", 0.2)
        metrics.lease_lost("q")
        for text in (
            generate_latest(metrics.registry).decode(),
            openmetrics_latest(metrics.registry).decode(),
        ):
            assert "jobs_total{" in text and "job_duration_seconds_bucket{" in text
            assert "job_leases_lost_total{" in text
            ours = [line for line in text.splitlines() if not line.startswith(("#", "app_"))]
            assert not [line for line in ours if "_created" in line], text
    # The app's own series are the app's: not changed process-wide.
    assert "app_requests_created" in generate_latest(app_registry).decode()
