"""The dashboard in a real browser: Chromium driven by Playwright, over pg with seeded jobs."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from subprocess import PIPE
from typing import Any

import dash_jobs
from playwright.async_api import BrowserContext, Page, Request, expect

from dash_helpers import seed_dead
from jobs_core import Worker, introspect, use_driver
from jobs_core.faults import Boundary, install_fault_hook
from jobs_core.scheduler import Scheduler
from jobs_core.testing import run_jobs
from jobs_core.types import JobState
from jobs_pg import PostgresDriver


async def shot(page: Page, folder: Path, name: str) -> None:
    await page.screenshot(path=str(folder / f"{name}.png"), full_page=True)


async def stat_cells(page: Page) -> dict[str, dict[str, str]]:
    rows = page.locator("table.queues tbody tr")
    found: dict[str, dict[str, str]] = {}
    for i in range(await rows.count()):
        row = rows.nth(i)
        queue = await row.get_attribute("data-queue")
        assert queue is not None
        cells = row.locator("td[data-stat]")
        found[queue] = {
            str(await cells.nth(j).get_attribute("data-stat")): (await cells.nth(j).inner_text())
            for j in range(await cells.count())
        }
    return found


async def test_overview_numbers_match_jobsctl_stats(
    driver: PostgresDriver, url: str, serve: Any, context: BrowserContext, screenshots: Path
) -> None:
    await seed_dead(driver, 3, "alpha")
    with use_driver(driver):
        await dash_jobs.noop.enqueue_many([dash_jobs.N(n=i) for i in range(4)], queue="beta")
        await run_jobs(driver, queues=["beta"])
        await dash_jobs.noop.enqueue_many([dash_jobs.N(n=100 + i) for i in range(5)], queue="alpha")
        await dash_jobs.noop.enqueue_many(
            [dash_jobs.N(n=200 + i) for i in range(2)], queue="beta", delay="1h"
        )
    await introspect.pause_queue(driver, "beta")
    async with serve() as base:
        page = await context.new_page()
        await page.goto(base + "/")
        shown = await stat_cells(page)
        await shot(page, screenshots, "overview")
    cli = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "jobs_core", "stats", "--json", "--driver", url, stdout=PIPE
    )
    try:
        async with asyncio.timeout(60):
            out, _ = await cli.communicate()
    finally:
        if cli.returncode is None:
            cli.kill()
            await cli.wait()
    assert cli.returncode == 0
    stats = {row["stats"]["queue"]: row for row in json.loads(out)}
    assert set(shown) == set(stats) == {"alpha", "beta"}
    for queue, row in stats.items():
        for key in ("ready", "delayed", "running", "suspended", "failed", "dead"):
            assert shown[queue][key] == str(row["stats"][key]), (queue, key)
        assert shown[queue]["demand"] == str(row["demand"])
        assert shown[queue]["paused"] == ("paused" if row["paused"] else "no")
    assert shown["alpha"]["ready"] == "5" and shown["alpha"]["dead"] == "3"
    assert shown["beta"]["delayed"] == "2"


async def test_filtering_to_dead_and_one_queue_shows_exactly_those_rows(
    driver: PostgresDriver, serve: Any, context: BrowserContext, screenshots: Path
) -> None:
    wanted = await seed_dead(driver, 7, "billing")
    await seed_dead(driver, 4, "mail", first=100)
    with use_driver(driver):
        await dash_jobs.noop.enqueue_many(
            [dash_jobs.N(n=300 + i) for i in range(3)], queue="billing"
        )
    async with serve() as base:
        page = await context.new_page()
        await page.goto(base + "/jobs")
        await page.select_option("select[name=state]", "dead")
        await page.fill("input[name=queue]", "billing")
        await page.click("form#filters button[type=submit]")
        await page.wait_for_url("**/jobs?state=dead&queue=billing")
        ids = await page.locator("tr[data-job-id]").evaluate_all(
            "rows => rows.map(r => r.dataset.jobId)"
        )
        assert sorted(ids) == sorted(str(i) for i in wanted)
        await shot(page, screenshots, "jobs-filtered")
        # The URL is the filter: a fresh tab opening it shows the same rows.
        again = await context.new_page()
        await again.goto(page.url)
        same = await again.locator("tr[data-job-id]").evaluate_all(
            "rows => rows.map(r => r.dataset.jobId)"
        )
        assert same == ids
        await again.goto(base + "/dead")
        await shot(again, screenshots, "dead-letters")


async def test_pages_back_and_forth_by_cursor(
    driver: PostgresDriver, serve: Any, context: BrowserContext
) -> None:
    await seed_dead(driver, 12, "paging")
    async with serve() as base:
        page = await context.new_page()
        await page.goto(base + "/jobs?queue=paging&limit=5")
        seen: list[list[str]] = []
        for _ in range(3):
            seen.append(
                await page.locator("tr[data-job-id]").evaluate_all(
                    "rows => rows.map(r => r.dataset.jobId)"
                )
            )
            older = page.locator("a[rel=next]")
            if await older.count() == 0:
                break
            async with page.expect_navigation():
                await older.click()
        assert [len(p) for p in seen] == [5, 5, 2]
        assert len({i for p in seen for i in p}) == 12
        async with page.expect_navigation():
            await page.locator("a[rel=prev]").click()
        back = await page.locator("tr[data-job-id]").evaluate_all(
            "rows => rows.map(r => r.dataset.jobId)"
        )
        assert back == seen[1]


async def test_bulk_retry_of_everything_matching_moves_all_250(
    driver: PostgresDriver,
    serve: Any,
    context: BrowserContext,
    sql: Callable[[str], list[tuple[Any, ...]]],
    screenshots: Path,
) -> None:
    await seed_dead(driver, 250, "bulk")
    await seed_dead(driver, 5, "untouched", first=1000)
    assert sql("SELECT count(*) FROM jobs WHERE queue = 'bulk' AND state = 'dead'") == [(250,)]
    async with serve() as base:
        page = await context.new_page()
        await page.goto(base + "/dead?queue=bulk&limit=20")
        await page.select_option("#bulk-action", "retry")
        await page.click("button[data-bulk=filter]")
        await expect(page.locator("p.summary")).to_contain_text(
            "Retry every job matching state=dead, queue=bulk"
        )
        await shot(page, screenshots, "bulk-confirm")
        await page.click("button[data-confirm-bulk]")
        await expect(page.locator("[data-result=affected]")).to_have_text("250")
        await expect(page.locator("[data-result=remaining]")).to_have_text("0")
        await shot(page, screenshots, "bulk-result")
    by_state = dict(sql("SELECT state, count(*) FROM jobs WHERE queue = 'bulk' GROUP BY state"))
    assert by_state == {"ready": 250}
    assert sql("SELECT state, count(*) FROM jobs WHERE queue = 'untouched' GROUP BY state") == [
        ("dead", 5)
    ]


async def test_bulk_on_a_selection_asks_then_acts_on_the_ticked_rows(
    driver: PostgresDriver, serve: Any, context: BrowserContext
) -> None:
    ids = await seed_dead(driver, 6, "pick")
    async with serve() as base:
        page = await context.new_page()
        await page.goto(base + "/dead?queue=pick")
        for job_id in ids[:2]:
            await page.check(f"input[name=id][value='{job_id}']")
        await page.select_option("#bulk-action", "delete")
        await page.click("button[data-bulk=selection]")
        await expect(page.locator("p.summary")).to_contain_text("Delete the 2 selected job(s)?")
        await page.click("button[data-confirm-bulk]")
        await expect(page.locator("[data-result=affected]")).to_have_text("2")
    left = {row.id for row in (await introspect.list_jobs(driver, queue="pick")).rows}
    assert left == set(ids[2:])


async def test_a_job_page_shows_its_steps_in_order_with_the_compensated_ones_marked(
    driver: PostgresDriver, serve: Any, context: BrowserContext, screenshots: Path
) -> None:
    with use_driver(driver):
        done = await dash_jobs.checkout.enqueue(
            dash_jobs.Checkout(
                order_id="o-1",
                card_token=dash_jobs.SECRET,
                note=dash_jobs.NOTE,
                password=dash_jobs.PASSWORD,
            )
        )
    await run_jobs(driver)
    assert (await introspect.get_job(driver, done.id)).job.state == JobState.DEAD
    async with serve() as base:
        page = await context.new_page()
        await page.goto(f"{base}/jobs/{done.id}")
        names = await page.locator("table.steps tbody tr").evaluate_all(
            "rows => rows.map(r => r.dataset.step)"
        )
        assert names == [
            "reserve",
            "charge",
            "ship",
            "unwinding",
            "compensate:charge",
            "compensate:reserve",
        ]
        compensated = await page.locator("tr[data-compensated]").evaluate_all(
            "rows => rows.map(r => r.dataset.step)"
        )
        assert compensated == ["reserve", "charge"]
        await expect(page.locator("tr[data-step=charge] [data-mark=compensated]")).to_be_visible()
        await expect(page.locator("[data-field=last-error]")).to_contain_text("carrier refused")
        await expect(page.locator("[data-field=input]")).to_contain_text("shown-to-operators")
        html = await page.content()
        for secret in (dash_jobs.SECRET, dash_jobs.NOTE, dash_jobs.PASSWORD):
            assert secret not in html
        await shot(page, screenshots, "job")


async def test_resolving_an_unknown_once_step_from_the_page_lets_retry_finish_the_run(
    driver: PostgresDriver, serve: Any, context: BrowserContext
) -> None:
    def crash_after_charge(at: Boundary) -> None:
        # The charge happened and the process "died" before its completion was written.
        if at.point == "returned" and at.step == "charge" and dash_jobs.EFFECTS["crashed"] == 0:
            dash_jobs.EFFECTS["crashed"] += 1
            raise RuntimeError("the worker died after the charge")

    dash_jobs.EFFECTS.clear()
    with use_driver(driver):
        paid = await dash_jobs.pay.enqueue(dash_jobs.Order(order_id="p-1"))
    install_fault_hook(crash_after_charge)
    try:
        await run_jobs(driver)
    finally:
        install_fault_hook(None)
    dead = (await introspect.get_job(driver, paid.id)).job
    assert dead.state == JobState.DEAD and dead.last_error_code == "X_STEP_OUTCOME_UNKNOWN"
    assert dash_jobs.EFFECTS["charge"] == 1
    async with serve() as base:
        page = await context.new_page()
        await page.goto(f"{base}/jobs/{paid.id}")
        await expect(page.locator("tr[data-step=charge] [data-mark=unknown]")).to_be_visible()
        await page.fill("[data-resolve=charge] textarea[name=output]", '{"charge": "ch-p-1"}')
        await page.click("[data-resolve=charge] button[data-resolve-ran]")
        await expect(page.locator("p.notice")).to_contain_text("Step resolved")
        await expect(page.locator("tr[data-step=charge]")).to_have_attribute(
            "data-status", "completed"
        )
        await page.click("form[action$='/retry'] button")
        await expect(page.locator("p.notice")).to_contain_text("Requeued")
    await run_jobs(driver)
    finished = (await introspect.get_job(driver, paid.id)).job
    assert finished.state == JobState.DONE
    assert finished.result == {"charged": {"charge": "ch-p-1"}, "receipt": "rc-p-1"}
    assert dash_jobs.EFFECTS["charge"] == 1  # resolving as ran did not charge again


async def test_a_finished_job_shows_up_within_2s_without_a_reload(
    driver: PostgresDriver, serve: Any, context: BrowserContext
) -> None:
    with use_driver(driver):
        queued = await dash_jobs.noop.enqueue(dash_jobs.N(n=1), queue="live")
    async with serve() as base:
        page = await context.new_page()
        await page.goto(f"{base}/jobs/{queued.id}")
        await expect(page.locator("#job-state")).to_have_text("ready")
        list_page = await context.new_page()
        await list_page.goto(f"{base}/jobs?queue=live")
        for tab in (page, list_page):
            await tab.evaluate("window.__sameDocument = true")
        await run_jobs(driver, queues=["live"])
        finished_at = time.monotonic()
        await expect(page.locator("#job-state")).to_have_text("done", timeout=2000)
        await expect(
            list_page.locator(f"tr[data-job-id='{queued.id}'] [data-field=state]")
        ).to_have_text(
            "done", timeout=max(100, int(2000 - (time.monotonic() - finished_at) * 1000))
        )
        shown_at = datetime.now(UTC)
        assert time.monotonic() - finished_at < 2.0
        # Measured from the finish itself too: the row's settle stamped updated_at (the server
        # and this test share the machine's clock), a moment before run_jobs returned.
        finished = (await introspect.get_job(driver, queued.id)).job
        assert finished.state == JobState.DONE
        assert shown_at - finished.updated_at < timedelta(seconds=2)
        for tab in (page, list_page):
            assert await tab.evaluate("window.__sameDocument === true")  # no reload happened


HIDE = """hidden => {
    Object.defineProperty(document, "hidden", {configurable: true, get: () => hidden});
    document.dispatchEvent(new Event("visibilitychange"));
}"""
"""Make the page believe its tab was hidden or shown (headless Chromium never hides one)."""


async def test_live_updates_pause_while_the_tab_is_hidden_and_resume_when_shown(
    driver: PostgresDriver, serve: Any, context: BrowserContext
) -> None:
    with use_driver(driver):
        queued = await dash_jobs.noop.enqueue(dash_jobs.N(n=2), queue="hidden")
    polls: list[float] = []  # when each live poll started
    pending: set[Request] = set()

    def started(request: Request) -> None:
        if "x-dashboard-live" in request.headers:
            polls.append(time.monotonic())
            pending.add(request)

    def ended(request: Request) -> None:
        pending.discard(request)

    async with serve() as base:
        page = await context.new_page()
        page.on("request", started)
        page.on("requestfinished", ended)
        page.on("requestfailed", ended)
        await page.goto(f"{base}/jobs?queue=hidden")
        async with page.expect_request(lambda request: "x-dashboard-live" in request.headers):
            pass  # polling runs while the tab shows
        await page.evaluate(HIDE, True)
        async with asyncio.timeout(10):
            while pending:  # a poll sent before the hide may still finish
                await asyncio.sleep(0.05)
        hidden_at = time.monotonic()
        await expect(page.locator("#live-status")).to_have_text("paused (tab hidden)")
        await run_jobs(driver, queues=["hidden"])
        await asyncio.sleep(2.5)  # more than two poll intervals, none of them polled
        assert [at for at in polls if at > hidden_at] == []
        cell = page.locator(f"tr[data-job-id='{queued.id}'] [data-field=state]")
        await expect(cell).to_have_text("ready")  # finished, but a hidden tab is not refreshed
        await page.evaluate(HIDE, False)
        await expect(cell).to_have_text("done", timeout=2000)
        await expect(page.locator("#live-status")).to_have_text("live")


async def test_workers_and_tasks_pages(
    driver: PostgresDriver, serve: Any, context: BrowserContext, screenshots: Path
) -> None:
    scheduler = Scheduler(driver)
    await scheduler.tick_once()
    await introspect.pause_task(driver, "dash.tick")
    worker = Worker(driver, queues=["default", "reports"], concurrency=4)
    running = asyncio.create_task(worker.run())
    try:
        async with asyncio.timeout(20):
            while not await introspect.workers(driver):
                await asyncio.sleep(0.05)
        async with serve() as base:
            page = await context.new_page()
            await page.goto(base + "/workers")
            row = page.locator("tr[data-worker]")
            await expect(row).to_have_count(1)
            await expect(row).to_contain_text("default, reports")
            await shot(page, screenshots, "workers")
            await page.goto(base + "/tasks")
            task_row = page.locator("tr[data-task='dash.tick']")
            await expect(task_row).to_contain_text("*/5 * * * *")
            await expect(task_row).to_contain_text("Europe/Paris")
            await expect(task_row.locator("[data-field=paused]")).to_have_text("paused")
            await shot(page, screenshots, "tasks")
            await task_row.locator("button", has_text="Resume").click()
            await expect(page.locator("p.notice")).to_contain_text("Resumed")
            await expect(task_row.locator("[data-field=paused]")).to_have_text("no")
            # Every task at once asks first, then counts what it paused.
            await page.click("button[name=scope][value=all][formaction$='/tasks/pause']")
            await expect(page.locator("p.summary")).to_contain_text("Pause 1 tasks: dash.tick?")
            await page.click("button[data-confirm-bulk]")
            await expect(page.locator("[data-result=affected]")).to_have_text("1")
    finally:
        async with asyncio.timeout(30):
            await worker.stop()
            await running
    assert await introspect.paused_tasks(driver) == ["dash.tick"]
