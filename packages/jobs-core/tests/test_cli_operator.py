"""The operator commands of ``jobsctl``: in process with typer's runner on an injected memory
driver, then as real subprocesses (a session over driver URLs, manifest with an installed
factory, and a worker serving metrics)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, Field
from typer.testing import CliRunner

from jobs_core import REGISTRY, JobRegistry, Retry, job, use_driver
from jobs_core.cli import create_app
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.ids import new_id
from jobs_core.testing import run_jobs
from jobs_core.types import (
    ClaimRequest,
    EnqueueRequest,
    NackOptions,
    StepRecord,
    StepWrite,
    TaskFire,
    WorkerInfo,
)

JOBS = [sys.executable, "-m", "jobs_core.cli"]
T_FIRE = datetime(2030, 1, 1, 3, tzinfo=UTC)


class Order(BaseModel):
    order: str
    card: str = Field(json_schema_extra={"sensitive": True})


@pytest.fixture
def checkout() -> Iterator[Any]:
    """A job in the process-wide registry (the CLI redacts with it), forgotten afterwards."""

    @job(
        input=Order,
        idempotency_key=lambda o: o.order,
        tenant="none",
        name="cli.checkout",
        retry=Retry(attempts=1),
    )
    async def checkout(order: Order, step: Any, ctx: Any) -> None:
        await step.run("reserve", lambda: {"held": True})
        await step.run("charge", lambda: {"charge": "ch_1"})
        await step.run("ship", lambda: None)
        if order.order.startswith("bad"):
            raise RuntimeError("carrier down")

    yield checkout
    REGISTRY.unregister("cli.checkout")


@pytest.fixture
def mem() -> MemoryDriver:
    return MemoryDriver()


def invoke(driver: MemoryDriver, *args: str) -> Any:
    return CliRunner().invoke(create_app(plugins=False, driver=driver), list(args))


def as_json(result: Any) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def run(driver: MemoryDriver, coro: Any) -> Any:
    async def go() -> Any:
        with use_driver(driver):
            return await coro

    return asyncio.run(go())


def scenario(driver: MemoryDriver, checkout: Any) -> dict[str, UUID]:
    """A dead checkout with three steps, a queued one and a delayed one."""

    async def build() -> dict[str, UUID]:
        bad = await checkout.enqueue(Order(order="bad-1", card="4242424242424242"))
        await run_jobs(driver, queues=["default"])
        ready = await checkout.enqueue(Order(order="ok-1", card="5555"))
        later = await checkout.enqueue(Order(order="ok-2", card="6666"), delay="1h")
        return {"dead": bad.id, "ready": ready.id, "delayed": later.id}

    ids: dict[str, UUID] = run(driver, build())
    return ids


# --- in process ------------------------------------------------------------------------------


def test_ls_dead_and_show_as_json_redact_the_input(mem: MemoryDriver, checkout: Any) -> None:
    ids = scenario(mem, checkout)

    listed = as_json(invoke(mem, "ls", "--json"))
    assert [row["id"] for row in listed["rows"]] == [
        str(ids["delayed"]),
        str(ids["ready"]),
        str(ids["dead"]),
    ]
    assert listed["next"] is None
    assert all(row["input"]["card"] == "[redacted]" for row in listed["rows"])
    only_dead = as_json(invoke(mem, "dead", "--json"))
    assert [row["id"] for row in only_dead["rows"]] == [str(ids["dead"])]
    paged = as_json(invoke(mem, "ls", "--limit", "2", "--json"))
    older = as_json(invoke(mem, "ls", "--limit", "2", "--after", paged["next"], "--json"))
    assert [row["id"] for row in older["rows"]] == [str(ids["dead"])]

    shown = as_json(invoke(mem, "show", str(ids["dead"]), "--json"))
    job = shown["job"]
    assert shown["declared"] is True
    assert job["state"] == "dead" and job["last_error_code"] == "X_JOB_MAX_ATTEMPTS"
    assert job["last_error"].endswith("the last failed with carrier down")
    assert "RuntimeError: carrier down" in job["last_error_stack"]
    assert [s["name"] for s in job["steps"]] == ["reserve", "charge", "ship"]
    assert job["input"] == {"order": "bad-1", "card": "[redacted]"}


def test_show_for_people_lists_steps_error_and_redacted_input(
    mem: MemoryDriver, checkout: Any
) -> None:
    ids = scenario(mem, checkout)

    shown = invoke(mem, "show", str(ids["dead"]))

    assert shown.exit_code == 0, shown.output
    out = shown.stdout
    for expected in ("cli.checkout", "dead", "carrier down", "reserve", "charge", "[redacted]"):
        assert expected in out
    assert "4242424242424242" not in out
    table = invoke(mem, "ls")
    assert str(ids["ready"]) in table.stdout and "ready" in table.stdout


def test_show_prints_the_result_each_steps_output_and_tries_counted_right(
    mem: MemoryDriver,
) -> None:
    """A step that ran once reads 1 try; one that failed once then completed, 2."""
    failures: list[int] = []

    def flaky_charge() -> dict[str, str]:
        if not failures:
            failures.append(1)
            raise RuntimeError("card network timeout")
        return {"charge": "ch_1"}

    @job(
        input=int,
        idempotency_key="input",
        tenant="none",
        name="cli.shown",
        retry=Retry(attempts=3, delay="10ms", jitter=False),
        registry=JobRegistry(),
    )
    async def shown(n: int, step: Any) -> dict[str, Any]:
        await step.run("reserve", lambda: {"held": True})
        await step.run("charge", flaky_charge)
        label = await step.run("label", lambda: "x" * 500)
        return {"shipped": n, "label": label}

    async def build() -> UUID:
        queued = await shown.enqueue(7)
        await run_jobs(mem, registry=shown.registry)
        return queued.id

    job_id = run(mem, build())

    text = invoke(mem, "show", str(job_id))
    assert text.exit_code == 0, text.output
    out = text.stdout
    assert re.search(r"^attempt\s+2/3\s*$", out, re.M), out
    assert '"shipped":7' in out  # the result, compact
    assert "earlier error" in out and "card network timeout" in out
    rows = {
        line.split()[1]: line.split() for line in out.splitlines() if re.match(r"\s*\d+ ", line)
    }
    assert rows["reserve"][3] == "1" and '{"held":true}' in rows["reserve"]
    assert rows["charge"][3] == "2" and '{"charge":"ch_1"}' in rows["charge"]
    label_row = next(line for line in out.splitlines() if line.lstrip().startswith("2 "))
    assert "xxx…" in label_row and "x" * 100 not in label_row  # cut to a width

    whole = as_json(invoke(mem, "show", str(job_id), "--json"))
    steps = {step["name"]: step for step in whole["job"]["steps"]}
    assert steps["label"]["output"] == "x" * 500  # --json prints it whole
    assert [steps[n]["tries"] for n in ("reserve", "charge", "label")] == [1, 2, 1]
    assert whole["job"]["result"] == {"shipped": 7, "label": "x" * 500}


def test_ls_shows_the_attempt_under_way_no_stale_error_and_a_cancel_reason(
    mem: MemoryDriver, checkout: Any
) -> None:
    async def build() -> dict[str, UUID]:
        running = await checkout.enqueue(Order(order="ok-run", card="1"))
        [claimed] = await mem.claim(ClaimRequest(["default"], 1, 60_000, "w1"))
        assert claimed.id == running.id
        cancelled = await checkout.enqueue(Order(order="ok-cancel", card="2"))
        return {"running": running.id, "cancelled": cancelled.id}

    # A done row whose first attempt failed keeps that error on the row.
    run(mem, _done_after_a_failure(mem))
    ids = run(mem, build())
    assert invoke(mem, "cancel", str(ids["cancelled"]), "--reason", "customer asked").exit_code == 0

    table = invoke(mem, "ls").stdout
    lines = {line.split()[0]: line for line in table.splitlines()[1:]}
    assert re.search(r"\brunning\s+1/1\b", lines[str(ids["running"])]), table
    assert lines[str(ids["cancelled"])].rstrip().endswith("customer asked"), table
    done = next(line for line in lines.values() if " done " in line)
    assert done.rstrip().endswith("+00:00") and "flaky first try" not in done, table
    shown = invoke(mem, "show", str(ids["cancelled"])).stdout
    assert re.search(r"^cancelled\s+customer asked", shown, re.M), shown


async def _done_after_a_failure(mem: MemoryDriver) -> None:
    tries: list[int] = []

    @job(
        input=int,
        idempotency_key="input",
        tenant="none",
        name="cli.flaky",
        retry=Retry(attempts=2, delay="10ms", jitter=False),
        registry=JobRegistry(),
    )
    async def flaky(n: int) -> int:
        tries.append(n)
        if len(tries) == 1:
            raise RuntimeError("flaky first try")
        return n

    queued = await flaky.enqueue(1)
    await run_jobs(mem, registry=flaky.registry)
    row = await mem.introspect.get(queued.id)
    assert row is not None and row.state.value == "done" and row.last_error is not None


def test_retry_cancel_promote_rm_change_the_rows(mem: MemoryDriver, checkout: Any) -> None:
    ids = scenario(mem, checkout)

    retried = as_json(invoke(mem, "retry", str(ids["dead"]), "--from-step", "charge", "--json"))
    assert retried["job"]["state"] == "ready"
    assert [s["name"] for s in retried["job"]["steps"]] == ["reserve"]

    cancelled = as_json(invoke(mem, "cancel", str(ids["ready"]), "--reason", "fraud", "--json"))
    assert (cancelled["job"]["state"], cancelled["job"]["last_error"]) == ("cancelled", "fraud")

    promoted = as_json(invoke(mem, "promote", str(ids["delayed"]), "--json"))
    assert promoted["job"]["state"] == "ready"

    removed = as_json(invoke(mem, "rm", str(ids["ready"]), "--json"))
    assert removed == {"removed": str(ids["ready"])}
    assert invoke(mem, "show", str(ids["ready"])).exit_code == 1

    people = invoke(mem, "retry", str(ids["ready"]))
    assert people.exit_code == 1 and "X_JOB_NOT_FOUND" in people.stderr


def test_refusals_exit_2_with_code_and_fix_and_not_found_exits_1(
    mem: MemoryDriver, checkout: Any
) -> None:
    ids = scenario(mem, checkout)
    run(mem, mem.claim(ClaimRequest(["default"], 1, 60_000, "w1")))  # the ready one runs

    not_cancellable = invoke(mem, "cancel", str(ids["dead"]))
    assert not_cancellable.exit_code == 2
    assert "X_JOB_NOT_CANCELLABLE" in not_cancellable.stderr
    assert "fix:" in not_cancellable.stderr
    assert "X_JOB_NOT_REMOVABLE" in invoke(mem, "rm", str(ids["ready"])).stderr
    assert invoke(mem, "retry", str(ids["ready"])).exit_code == 2
    assert invoke(mem, "promote", str(ids["dead"])).exit_code == 2
    bad_step = invoke(mem, "retry", str(ids["dead"]), "--from-step", "nope")
    assert bad_step.exit_code == 2 and "X_DRIVER_REQUEST_INVALID" in bad_step.stderr
    for missing in (str(uuid.uuid4()), "not-an-id"):
        result = invoke(mem, "show", missing)
        assert result.exit_code == 1 and "X_JOB_NOT_FOUND" in result.stderr
    assert invoke(mem, "ls", "--limit", "500").exit_code == 2
    assert "X_JOB_PAGE_INVALID" in invoke(mem, "ls", "--after", "zzz").stderr


def test_usage_errors_exit_2() -> None:
    mem = MemoryDriver()
    for args in (
        ["retry"],
        ["retry", str(uuid.uuid4()), "--all-dead"],
        ["rm"],
        ["promote"],
        ["resolve-step", str(uuid.uuid4()), "s"],
        ["resolve-step", str(uuid.uuid4()), "s", "--ran", "--not-ran"],
        ["resolve-step", str(uuid.uuid4()), "s", "--not-ran", "--output", "1"],
        ["resolve-step", str(uuid.uuid4()), "s", "--ran", "--output", "{nope"],
        ["ls", "--state", "exploded"],
    ):
        assert invoke(mem, *args).exit_code == 2, args
    no_driver = CliRunner().invoke(create_app(plugins=False), ["ls"], env={"JOBS_DRIVER": ""})
    assert no_driver.exit_code == 2 and "--driver" in no_driver.output
    unknown = CliRunner().invoke(create_app(plugins=False), ["ls", "--driver", "nosuch://x"])
    assert unknown.exit_code == 2 and "X_DRIVER_UNKNOWN" in unknown.stderr


def test_bulk_retry_and_rm_of_dead_jobs_run_until_none_remain(mem: MemoryDriver) -> None:
    async def bury(count: int) -> None:
        reqs = [
            EnqueueRequest("bulk", "default", {}, f"k{i}", None, 1, new_id(), new_id())
            for i in range(count)
        ]
        await mem.enqueue_many(reqs)
        for claimed in await mem.claim(ClaimRequest(["default"], count, 60_000, "w1")):
            await mem.nack(claimed.id, NackOptions(claimed.fence, dead_letter=True))

    run(mem, bury(1_205))
    assert invoke(mem, "dead", "--check").exit_code == 1

    retried = as_json(invoke(mem, "retry", "--all-dead", "--json"))
    assert retried == {"affected": 1_205, "remaining": 0}
    assert invoke(mem, "dead", "--check").exit_code == 0
    [stats] = as_json(invoke(mem, "stats", "--json"))
    assert (stats["stats"]["ready"], stats["stats"]["dead"]) == (1_205, 0)

    for claimed in run(mem, mem.claim(ClaimRequest(["default"], 2_000, 60_000, "w1"))):
        run(mem, mem.nack(claimed.id, NackOptions(claimed.fence, dead_letter=True)))
    people = invoke(mem, "rm", "--all-dead", "--name", "bulk")
    assert people.exit_code == 0 and "removed: 1205 job(s)" in people.stdout
    assert as_json(invoke(mem, "ls", "--json"))["rows"] == []


def test_bulk_commands_show_a_bar_on_a_terminal_and_stay_quiet_under_json(
    mem: MemoryDriver,
) -> None:
    async def bury(count: int) -> None:
        reqs = [
            EnqueueRequest("bar", "default", {}, f"k{i}", None, 1, new_id(), new_id())
            for i in range(count)
        ]
        await mem.enqueue_many(reqs)
        for claimed in await mem.claim(ClaimRequest(["default"], count, 60_000, "w1")):
            await mem.nack(claimed.id, NackOptions(claimed.fence, dead_letter=True))

    terminal = {"FORCE_COLOR": "1"}  # rich treats the output as a terminal
    app = create_app(plugins=False, driver=mem)
    run(mem, bury(1_500))
    people = CliRunner().invoke(app, ["retry", "--all-dead"], env=terminal)
    assert people.exit_code == 0, people.output
    assert "━" in people.stdout  # the progress bar
    assert "requeued: 1500 job(s)" in people.stdout

    run(mem, bury(10))
    scripted = CliRunner().invoke(app, ["rm", "--all-dead", "--json"], env=terminal)
    assert json.loads(scripted.stdout) == {"affected": 10, "remaining": 0}


def test_stats_workers_pause_and_resume(mem: MemoryDriver, checkout: Any) -> None:
    scenario(mem, checkout)
    started = datetime(2030, 1, 1, tzinfo=UTC)
    run(mem, mem.workers.beat(WorkerInfo("w-1", "pod-a", "1.0", started, ("default",), 8), 60_000))

    paused = as_json(invoke(mem, "pause", "default", "--json"))
    assert paused == {"paused": ["default"]}
    [queue] = as_json(invoke(mem, "stats", "--json"))
    assert queue["paused"] is True and queue["demand"] == 0
    assert (queue["stats"]["ready"], queue["stats"]["delayed"], queue["stats"]["dead"]) == (1, 1, 1)
    assert as_json(invoke(mem, "resume", "default", "--json")) == {"paused": []}
    [queue] = as_json(invoke(mem, "stats", "--json"))
    assert queue["paused"] is False and queue["demand"] == 1

    [worker] = as_json(invoke(mem, "workers", "--json"))
    assert (worker["id"], worker["host"], worker["slots"]) == ("w-1", "pod-a", 8)
    people = invoke(mem, "workers")
    assert "pod-a" in people.stdout
    assert "default" in invoke(mem, "stats").stdout


def test_tasks_ls_pause_resume(mem: MemoryDriver) -> None:
    assert as_json(invoke(mem, "tasks", "pause", "nightly", "--json")) == {"paused": ["nightly"]}
    listed = as_json(invoke(mem, "tasks", "--json"))
    assert listed == [
        {
            "task": "nightly",
            "cron": None,
            "tz": None,
            "watermark": None,
            "last_fire": None,
            "paused": True,
        }
    ]
    assert as_json(invoke(mem, "tasks", "ls", "--json")) == listed
    # The group's options may come before the subcommand.
    assert as_json(invoke(mem, "tasks", "--json", "ls")) == listed
    assert as_json(invoke(mem, "tasks", "--json", "resume", "nightly")) == {"paused": []}
    assert "paused" not in invoke(mem, "tasks").stdout


def test_tasks_shows_the_schedule_from_the_store_without_the_app(mem: MemoryDriver) -> None:
    fire = TaskFire("reports.nightly", T_FIRE, None, (), cron="0 3 * * *", tz="Europe/Paris")
    assert run(mem, mem.scheduler_state.fire(fire)) == []

    [listed] = as_json(invoke(mem, "tasks", "--json"))
    assert (listed["cron"], listed["tz"]) == ("0 3 * * *", "Europe/Paris")
    table = invoke(mem, "tasks", "ls")
    assert table.exit_code == 0, table.output
    assert "0 3 * * * Europe/Paris" in table.stdout


def test_resolve_step_records_an_unknown_once_step(mem: MemoryDriver) -> None:
    async def started() -> UUID:
        req = EnqueueRequest("once", "default", {}, "k", None, 3, new_id(), new_id())
        await mem.enqueue(req)
        [row] = await mem.claim(ClaimRequest(["default"], 1, 60_000, "w1"))
        record = StepRecord(name="charge", status="started", once=True)
        await mem.steps.write(StepWrite(row.id, row.fence, row.run_id, record))
        await mem.nack(row.id, NackOptions(row.fence, dead_letter=True))
        return row.id

    job_id = run(mem, started())
    done = invoke(mem, "resolve-step", str(job_id), "charge", "--ran", "--output", '{"id": 7}')
    assert done.exit_code == 0, done.output
    assert "jobsctl retry" in done.stdout
    shown = as_json(invoke(mem, "show", str(job_id), "--json"))
    assert shown["declared"] is False and shown["job"]["input"] == "[redacted]"
    [step] = shown["job"]["steps"]
    assert (step["status"], step["output"]) == ("completed", {"id": 7})
    again = invoke(mem, "resolve-step", str(job_id), "charge", "--not-ran")
    assert again.exit_code == 2 and "X_STEP_NOT_RESOLVABLE" in again.stderr


# --- subprocesses ----------------------------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "COLUMNS")}
    env["NO_COLOR"] = "1"
    env.update(extra)
    return env


def _jobs(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*JOBS, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )


SESSION_ROWS = """
    # The session's rows, made through the driver. On the memory driver every process starts
    # empty, so each command imports this module (--app) and it makes them at import, on the
    # driver the CLI installed; a persistent driver gets them once, from SESSION_SETUP.
    import json
    import os
    from uuid import UUID

    from jobs_core import current_driver
    from jobs_core._current import run_sync
    from jobs_core.types import ClaimRequest, EnqueueRequest, NackOptions, StepRecord, StepWrite

    IDS = {k: UUID(v) for k, v in json.loads(os.environ["SESSION_IDS"]).items()}
    QUEUE = os.environ["SESSION_QUEUE"]


    def request(which, key, **options):
        return EnqueueRequest(
            name="session.order",
            queue=QUEUE,
            input={"order": key, "card": "4111-" + key},
            idempotency_key=key,
            tenant_id=None,
            max_attempts=1,
            id=IDS[which],
            run_id=IDS[which + "_run"],
            **options,
        )


    async def setup():
        driver = current_driver()
        if await driver.introspect.get(IDS["dead"]) is not None:
            return
        await driver.enqueue(request("dead", "d"))
        [row] = await driver.claim(ClaimRequest([QUEUE], 1, 60_000, "session"))
        for name in ("a", "b", "c"):
            record = StepRecord(name=name, status="completed", output={"step": name})
            await driver.steps.write(StepWrite(row.id, row.fence, row.run_id, record))
        await driver.nack(row.id, NackOptions(row.fence, dead_letter=True))
        await driver.enqueue(request("ready", "r"))
        await driver.enqueue(request("delayed", "l", delay_ms=3_600_000))


    if os.environ.get("SESSION_SETUP_AT_IMPORT") == "1":
        run_sync(setup())
"""

SESSION_SETUP = """
import asyncio, os

from jobs_core import install_driver, open_driver

import session_rows


async def main():
    driver = open_driver(os.environ["JOBS_DRIVER"])
    install_driver(driver)
    try:
        await session_rows.setup()
    finally:
        await driver.close()


asyncio.run(main())
"""

SESSION_JOBS = """
    from pydantic import BaseModel, Field

    from jobs_core import job


    class Order(BaseModel):
        order: str
        card: str = Field(json_schema_extra={"sensitive": True})


    @job(input=Order, idempotency_key=lambda o: o.order, tenant="none", name="session.order")
    async def order(o, step, ctx):
        await step.run("a", lambda: 1)
"""


def _driver_urls() -> list[Any]:
    urls: list[Any] = [pytest.param("memory://", False, id="memory")]
    if any(ep.name == "postgresql" for ep in entry_points(group="jobs.drivers")):
        pg = os.environ.get("JOBS_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
        urls.append(pytest.param(pg, True, id="postgresql", marks=pytest.mark.pg))
    if any(ep.name == "redis" for ep in entry_points(group="jobs.drivers")):
        redis = os.environ.get("JOBS_REDIS_URL", "redis://127.0.0.1:6379/0")
        urls.append(pytest.param(redis, True, id="redis", marks=pytest.mark.redis))
    return urls


@pytest.fixture
def session_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The driver URL for one session; a Postgres one gets a fresh schema, migrated, and a Redis
    one a fresh key prefix, its keys deleted afterwards."""
    base: str = request.param
    if base.startswith("redis"):
        import redis

        prefix = f"cli_{uuid.uuid4().hex[:12]}"
        try:
            yield f"{base}?prefix={prefix}"
        finally:
            client = redis.Redis.from_url(base)
            for key in client.scan_iter(match="{" + prefix + "}*", count=1000):
                client.delete(key)
            client.close()
        return
    if not base.startswith("postgresql"):
        yield base
        return
    import psycopg

    schema = f"cli_{uuid.uuid4().hex[:12]}"
    url = f"{base}?schema={schema}"
    migrated = _jobs(
        "pg", "migrate", "--driver", base, "--schema", schema, cwd=tmp_path, env=_env()
    )
    assert migrated.returncode == 0, migrated.stderr
    try:
        yield url
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.mark.parametrize(("session_url", "persistent"), _driver_urls(), indirect=["session_url"])
def test_a_cli_session_in_separate_processes(
    session_url: str, persistent: bool, tmp_path: Path
) -> None:
    (tmp_path / "session_rows.py").write_text(textwrap.dedent(SESSION_ROWS))
    (tmp_path / "session_jobs.py").write_text(textwrap.dedent(SESSION_JOBS))
    ids = {k: str(uuid.uuid4()) for k in ("dead", "ready", "delayed")}
    ids |= {f"{k}_run": str(uuid.uuid4()) for k in list(ids)}
    queue = f"session-{uuid.uuid4().hex[:8]}"
    env = _env(JOBS_DRIVER=session_url, SESSION_IDS=json.dumps(ids), SESSION_QUEUE=queue)
    if persistent:
        rows: list[str] = []
        setup = subprocess.run(
            [sys.executable, "-c", SESSION_SETUP],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert setup.returncode == 0, setup.stderr
    else:
        env["SESSION_SETUP_AT_IMPORT"] = "1"
        rows = ["--app", "session_rows"]
    declared = [*rows, "--app", "session_jobs"]

    def jobs(*args: str, status: int = 0) -> Any:
        done = _jobs(*args, cwd=tmp_path, env=env)
        assert done.returncode == status, f"jobsctl {' '.join(args)}: {done.stdout}{done.stderr}"
        return json.loads(done.stdout) if status == 0 and "--json" in args else done

    listed = jobs("ls", "--queue", queue, "--json", *rows)
    assert {row["id"]: row["state"] for row in listed["rows"]} == {
        ids["dead"]: "dead",
        ids["ready"]: "ready",
        ids["delayed"]: "delayed",
    }
    undeclared = jobs("show", ids["dead"], "--json", *rows)
    assert undeclared["declared"] is False and undeclared["job"]["input"] == "[redacted]"
    shown = jobs("show", ids["dead"], "--json", *declared)
    assert shown["declared"] is True
    assert shown["job"]["input"] == {"order": "d", "card": "[redacted]"}
    assert [s["name"] for s in shown["job"]["steps"]] == ["a", "b", "c"]

    cancelled = jobs("cancel", ids["ready"], "--reason", "ops", "--json", *rows)
    assert (cancelled["job"]["state"], cancelled["job"]["last_error"]) == ("cancelled", "ops")
    retried = jobs("retry", ids["dead"], "--from-step", "b", "--json", *rows)
    assert retried["job"]["state"] == "ready"
    assert [s["name"] for s in retried["job"]["steps"]] == ["a"]
    assert jobs("pause", queue, "--json", *rows)["paused"] == [queue]
    overview = {q["stats"]["queue"]: q for q in jobs("stats", "--json", *rows)}
    assert overview[queue]["paused"] is persistent
    assert queue not in jobs("resume", queue, "--json", *rows)["paused"]

    # What a later process sees: the earlier processes' changes, where the driver keeps them.
    later = jobs("show", ids["ready"], "--json", *rows)
    assert later["job"]["state"] == ("cancelled" if persistent else "ready")
    replayed = jobs("show", ids["dead"], "--json", *rows)
    assert replayed["job"]["state"] == ("ready" if persistent else "dead")
    missing = jobs("show", str(uuid.uuid4()), *rows, status=1)
    assert "X_JOB_NOT_FOUND" in missing.stderr

    # tasks honours --driver given before its subcommand (over JOBS_DRIVER, here a bad one).
    env["JOBS_DRIVER"] = "nosuch://"
    assert jobs("tasks", "--driver", session_url, "--json", "pause", "t1", *rows) == {
        "paused": ["t1"]
    }
    assert [t["task"] for t in jobs("tasks", "--driver", session_url, "ls", "--json", *rows)] == (
        ["t1"] if persistent else []
    )


FACTORY_DIST = {
    "acme_factories-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: acme-factories\n"
    "Version: 0.1\n",
    "acme_factories-0.1.dist-info/entry_points.txt": "[jobs.factories]\n"
    "webhook = acme_factories:webhook\n",
    "acme_factories.py": "def webhook(**options):\n    raise NotImplementedError\n",
    "manifest_app.py": textwrap.dedent(
        """
        from pydantic import BaseModel

        from jobs_core import job, task


        class Ping(BaseModel):
            host: str


        @job(input=Ping, idempotency_key=lambda p: p.host, tenant="none", name="ops.ping")
        async def ping(p, step, ctx): ...


        nightly = task(
            cron="0 3 * * *",
            tz="Europe/Paris",
            name="ops.nightly",
            enqueue=lambda occurrence: [(ping, Ping(host="db"))],
        )
        """
    ),
}


def test_manifest_lists_jobs_tasks_and_installed_factories(tmp_path: Path) -> None:
    for name, text in FACTORY_DIST.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    env = _env(PYTHONPATH=str(tmp_path))

    done = _jobs("manifest", "manifest_app", "--json", cwd=tmp_path, env=env)

    assert done.returncode == 0, done.stderr
    entries = {(e["kind"], e["name"]): e for e in json.loads(done.stdout)}
    assert entries[("job", "ops.ping")]["queue"] == "default"
    assert entries[("task", "ops.nightly")]["cron"] == "0 3 * * *"
    assert entries[("task", "ops.nightly")]["jobs"] == ["ops.ping"]
    # Matched by distribution: an installed jobs-webhooks registers a factory named webhook too.
    factories = [e for e in json.loads(done.stdout) if e["kind"] == "factory"]
    (factory,) = [e for e in factories if e["distribution"] == "acme-factories"]
    assert (factory["name"], factory["value"]) == ("webhook", "acme_factories:webhook")
    people = _jobs("manifest", "manifest_app", cwd=tmp_path, env=env)
    assert "ops.nightly" in people.stdout and "0 3 * * * Europe/Paris" in people.stdout


METRICS_APP = """
    from pydantic import BaseModel

    from jobs_core import Retry, job


    class Item(BaseModel):
        key: str


    @job(input=Item, idempotency_key=lambda i: i.key, tenant="none", name="m.ok")
    async def ok(item, step, ctx): ...


    @job(input=Item, idempotency_key=lambda i: i.key, tenant="none", name="m.bad",
         retry=Retry(attempts=1))
    async def bad(item, step, ctx):
        raise RuntimeError("no")


    @job(input=Item, idempotency_key=lambda i: i.key, tenant="none", name="m.later",
         queue="backlog")
    async def later(item, step, ctx): ...


    for key in ("1", "2"):
        ok.enqueue_sync(Item(key=key))
    bad.enqueue_sync(Item(key="x"))
    for key in ("a", "b"):
        later.enqueue_sync(Item(key=key))
"""


def _metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_jobs_worker_serves_metrics_on_its_port(tmp_path: Path) -> None:
    (tmp_path / "metrics_app.py").write_text(textwrap.dedent(METRICS_APP))
    proc = subprocess.Popen(
        [
            *JOBS,
            *("worker", "metrics_app", "--driver", "memory://", "--queues", "default"),
            *("--metrics-port", "0", "--build", "v9"),
        ],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        port = None
        deadline = time.monotonic() + 20
        while port is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            found = re.search(r"jobs\.metrics\.serving .*port=(\d+)", line)
            port = int(found[1]) if found else None
        assert port is not None, "the worker never said where it serves metrics"
        expected = {
            ("jobs_total", (("outcome", "completed"), ("queue", "default"))): 2,
            ("jobs_total", (("outcome", "dead-lettered"), ("queue", "default"))): 1,
            ("job_duration_seconds_count", (("job", "m.ok"), ("queue", "default"))): 2,
            ("queue_depth", (("queue", "backlog"),)): 2,
            ("queue_demand", (("queue", "backlog"),)): 2,
            ("job_worker_capacity", ()): 64,  # DEFAULT_CONCURRENCY, one queue
        }
        got: dict[Any, float] = {}
        while time.monotonic() < deadline:
            got = _metrics(port)
            if all(got.get(key) == value for key, value in expected.items()):
                break
            time.sleep(0.05)
        assert {key: got.get(key) for key in expected} == expected
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_enqueue_of_a_misspelt_name_suggests_the_declared_one(checkout: Any) -> None:
    """A near miss names the job it was probably meant to be; nothing is enqueued."""
    done = CliRunner().invoke(
        create_app(plugins=False),
        [
            "enqueue",
            "cli.chekout",
            "--input",
            '{"order": "o1", "card": "4242"}',
            "--driver",
            "memory://",
        ],
    )

    assert done.exit_code == 2, done.output
    assert "X_JOB_UNKNOWN" in done.stderr
    assert "did you mean 'cli.checkout'?" in done.stderr
    assert "4242" not in done.stderr


def test_stats_shows_a_dash_for_the_oldest_wait_of_a_queue_with_nothing_due(
    mem: MemoryDriver, checkout: Any
) -> None:
    run(mem, checkout.enqueue(Order(order="o-late", card="4242"), delay="1h"))
    [queue] = as_json(invoke(mem, "stats", "--json"))
    assert (queue["stats"]["ready"], queue["stats"]["oldest_ready_ms"]) == (0, 0)

    shown = invoke(mem, "stats")
    assert shown.exit_code == 0, shown.output
    [line] = [ln for ln in shown.stdout.splitlines() if ln.startswith("default")]
    assert "0.0s" not in line
    assert " - " in f"{line} "


class Part(BaseModel):
    n: int


@pytest.fixture
def assembly() -> Iterator[Any]:
    """A parent gathering two child jobs, in the process-wide registry, forgotten afterwards."""

    @job(input=Part, idempotency_key=lambda p: str(p.n), tenant="none", name="cli.part")
    async def part(input: Part, step: Any, ctx: Any) -> int:
        return input.n * 10

    @job(input=Part, idempotency_key=lambda p: str(p.n), tenant="none", name="cli.assemble")
    async def assemble(input: Part, step: Any, ctx: Any) -> int:
        parts = await step.gather("parts", [(part, Part(n=1)), (part, Part(n=2))])
        return sum(int(str(p)) for p in parts)

    yield assemble
    REGISTRY.unregister("cli.part")
    REGISTRY.unregister("cli.assemble")


def test_show_links_a_parent_and_its_child_jobs(mem: MemoryDriver, assembly: Any) -> None:
    async def build() -> UUID:
        parent = await assembly.enqueue(Part(n=7))
        await run_jobs(mem, queues=["default"])
        return parent.id

    parent_id = run(mem, build())
    shown = as_json(invoke(mem, "show", str(parent_id), "--json"))
    assert shown["job"]["state"] == "done" and shown["job"]["result"] == 30
    children = shown["children"]
    assert [c["name"] for c in children] == ["cli.part", "cli.part"]
    assert {c["state"] for c in children} == {"done"}
    child = as_json(invoke(mem, "show", children[0]["id"], "--json"))
    assert child["job"]["parent_run_id"] == shown["job"]["run_id"]
    assert child["children"] == []
    people = invoke(mem, "show", str(parent_id))
    assert people.exit_code == 0, people.output
    assert "children" in people.stdout and children[1]["id"] in people.stdout
    kid = invoke(mem, "show", children[0]["id"])
    assert "parent run" in kid.stdout and shown["job"]["run_id"] in kid.stdout
