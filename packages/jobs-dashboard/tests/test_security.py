"""Security: CSRF, read-only, auth on every route, redaction in the served HTML, escaping."""

from __future__ import annotations

import logging
import re
import uuid
from typing import Any

import dash_jobs
import httpx
import pytest
from playwright.async_api import BrowserContext
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Mount

from dash_helpers import CREDENTIALS, csrf_of, seed_dead, serving
from jobs_core import introspect, use_driver
from jobs_core.tenancy import Actor
from jobs_core.testing import run_jobs
from jobs_core.types import EnqueueRequest, JobState
from jobs_dashboard import dashboard_app
from jobs_pg import PostgresDriver

GET_ROUTES = ["/", "/jobs", "/dead", "/workers", "/tasks", "/jobs?state=dead"]
JOB_ACTIONS = ["retry", "retry-from-step", "cancel", "delete", "promote", "resolve"]


def post_routes(job_id: str) -> list[tuple[str, dict[str, str]]]:
    """Every action route with fields that would make it act."""
    routes: list[tuple[str, dict[str, str]]] = [
        (f"/jobs/{job_id}/{action}", {"step": "charge", "outcome": "not-ran"})
        for action in JOB_ACTIONS
    ]
    routes += [
        ("/bulk", {"action": "retry", "scope": "filter", "state": "dead", "confirmed": "yes"}),
        ("/bulk", {"action": "delete", "scope": "selection", "id": job_id, "confirmed": "yes"}),
        ("/queues/pause", {"queue": "default"}),
        ("/queues/resume", {"queue": "default", "scope": "all", "confirmed": "yes"}),
        ("/tasks/pause", {"task": "dash.tick"}),
        ("/tasks/resume", {"task": "dash.tick"}),
    ]
    return routes


async def test_a_post_without_the_csrf_token_is_403_and_changes_nothing(
    driver: PostgresDriver, serve: Any
) -> None:
    [dead] = await seed_dead(driver, 1, "default")
    async with serve() as base, httpx.AsyncClient(base_url=base, auth=CREDENTIALS) as client:
        page = await client.get(f"/jobs/{dead}")
        token = csrf_of(page.text)
        for path, fields in post_routes(str(dead)):
            for sent in (fields, {**fields, "csrf": "0" * 64}):
                refused = await client.post(path, data=sent)
                assert refused.status_code == 403, (path, sent.keys())
                assert "CSRF" in refused.text
        # The right token from another browser (no nonce cookie) is refused too.
        async with httpx.AsyncClient(base_url=base, auth=CREDENTIALS) as other:
            stolen = await other.post(f"/jobs/{dead}/retry", data={"csrf": token})
            assert stolen.status_code == 403
        job = (await introspect.get_job(driver, dead)).job
        assert job.state == JobState.DEAD
        assert await introspect.paused_queues(driver) == []
        assert await introspect.paused_tasks(driver) == []
        accepted = await client.post(f"/jobs/{dead}/retry", data={"csrf": token})
        assert accepted.status_code == 303
    assert (await introspect.get_job(driver, dead)).job.state == JobState.READY


async def test_read_only_hides_and_refuses_every_action(driver: PostgresDriver, serve: Any) -> None:
    [dead] = await seed_dead(driver, 1, "default")
    async with (
        serve(read_only=True) as base,
        httpx.AsyncClient(base_url=base, auth=CREDENTIALS) as client,
    ):
        for path in [*GET_ROUTES, f"/jobs/{dead}"]:
            page = await client.get(path, follow_redirects=True)
            assert page.status_code == 200, path
            assert 'method="post"' not in page.text, path
            assert "read-only" in page.text
        # A read-only page carries no form and so no token: the read-only gate comes before
        # the CSRF one, so any token shows it refuses on its own.
        token = "ab" * 32
        for path, fields in post_routes(str(dead)):
            refused = await client.post(path, data={**fields, "csrf": token})
            assert refused.status_code == 403, path
            assert "read-only" in refused.text
    assert (await introspect.get_job(driver, dead)).job.state == JobState.DEAD
    assert await introspect.paused_queues(driver) == []


async def test_auth_answering_none_is_401_on_every_route(
    driver: PostgresDriver, serve: Any
) -> None:
    [dead] = await seed_dead(driver, 1, "default")
    paths = [*GET_ROUTES, f"/jobs/{dead}", "/static/", "/static/dashboard.js", "/static/nope.txt"]
    async with serve(auth=lambda request: None) as base, httpx.AsyncClient(base_url=base) as client:
        for path in paths:
            page = await client.get(path)
            assert page.status_code == 401, path
            assert "dashboard.js" not in page.text
        for path, fields in post_routes(str(dead)):
            assert (await client.post(path, data=fields)).status_code == 401, path
    # Basic auth: no credentials or wrong ones are 401 and ask the browser for them.
    async with serve() as base, httpx.AsyncClient(base_url=base) as client:
        for auth in (None, ("ops", "wrong"), ("nobody", "correct horse battery")):
            page = await client.get("/static/", auth=auth)  # type: ignore[arg-type]
            assert page.status_code == 401
            assert page.headers["www-authenticate"].startswith('Basic realm="jobs-dashboard"')
        listing = await client.get("/static/", auth=CREDENTIALS)
        assert listing.status_code == 404  # signed in: still no directory listing
    assert (await introspect.get_job(driver, dead)).job.state == JobState.DEAD


async def test_input_fields_marked_sensitive_never_reach_the_html(
    driver: PostgresDriver, serve: Any
) -> None:
    with use_driver(driver):
        made = await dash_jobs.checkout.enqueue(
            dash_jobs.Checkout(
                order_id="o-9",
                card_token=dash_jobs.SECRET,
                note=dash_jobs.NOTE,
                password=dash_jobs.PASSWORD,
            )
        )
    await run_jobs(driver)
    secrets = (dash_jobs.SECRET, dash_jobs.NOTE, dash_jobs.PASSWORD)
    async with serve() as base, httpx.AsyncClient(base_url=base, auth=CREDENTIALS) as client:
        job_page = await client.get(f"/jobs/{made.id}")
        assert job_page.status_code == 200
        assert "[redacted]" in job_page.text and "shown-to-operators" in job_page.text
        pages = [job_page.text]
        for path in [*GET_ROUTES, "/jobs?name=dash.checkout"]:
            pages.append((await client.get(path, follow_redirects=True)).text)
        token = csrf_of(job_page.text)
        confirm = await client.post(
            "/bulk",
            data={"csrf": token, "action": "retry", "scope": "selection", "id": str(made.id)},
        )
        pages.append(confirm.text)
    for html in pages:
        for secret in secrets:
            assert secret not in html


async def test_a_job_name_or_error_holding_script_is_shown_escaped(
    driver: PostgresDriver, serve: Any, context: BrowserContext
) -> None:
    await seed_dead(driver, 1, "default")
    with use_driver(driver):
        failed = await dash_jobs.xss.enqueue(dash_jobs.N(n=1))
    await run_jobs(driver)
    name = "<script>window.__xss = 2</script>"
    raw = await driver.enqueue(
        EnqueueRequest(
            name=name,
            queue="<b>q</b>",
            input={"x": "<script>window.__xss = 3</script>"},
            idempotency_key="k<script>",
            tenant_id="<i>t</i>",
            max_attempts=1,
            id=uuid.uuid4(),
            run_id=uuid.uuid4(),
        )
    )
    paths = ["/", "/jobs", "/dead", f"/jobs/{failed.id}", f"/jobs/{raw.id}", "/jobs?queue=<b>q</b>"]
    async with serve() as base:
        async with httpx.AsyncClient(base_url=base, auth=CREDENTIALS) as client:
            for path in paths:
                html = (await client.get(path, follow_redirects=True)).text
                assert "<script>window" not in html, path
                assert "<img src=x" not in html and "<b>q</b>" not in html, path
            shown = (await client.get(f"/jobs/{failed.id}")).text
            assert "&lt;script&gt;window.__xss = 1&lt;/script&gt;" in shown
            assert (
                "&lt;script&gt;window.__xss = 2&lt;/script&gt;"
                in (await client.get(f"/jobs/{raw.id}")).text
            )
        page = await context.new_page()
        for path in paths:
            await page.goto(base + path)
            assert await page.evaluate("window.__xss === undefined"), path
        await page.goto(f"{base}/jobs/{failed.id}")
        text = await page.locator("[data-field=last-error]").inner_text()
        assert "<script>window.__xss = 1</script>" in text  # shown as text, not run


async def test_every_action_is_logged_with_the_actor(
    driver: PostgresDriver, caplog: pytest.LogCaptureFixture
) -> None:
    ids = await seed_dead(driver, 3, "audit")

    async def auth(request: Request) -> Actor | None:
        return Actor(id="alice") if request.headers.get("x-user") == "alice" else None

    app = dashboard_app(driver, auth=auth)
    headers = {"x-user": "alice"}
    async with serving(app) as base, httpx.AsyncClient(base_url=base, headers=headers) as client:
        token = csrf_of((await client.get(f"/jobs/{ids[0]}")).text)
        caplog.set_level(logging.INFO, logger="jobs.dashboard")
        await client.post(f"/jobs/{ids[0]}/retry", data={"csrf": token})
        fields = {"csrf": token, "action": "retry", "scope": "filter", "queue": "audit"}
        confirm = await client.post("/bulk", data={**fields, "state": "dead"})
        assert "Confirm" in confirm.text
        assert (await introspect.get_job(driver, ids[1])).job.state == JobState.DEAD
        done = await client.post("/bulk", data={**fields, "state": "dead", "confirmed": "yes"})
        assert re.search(r'data-result="affected">2<', done.text)
        await client.post(f"/jobs/{ids[0]}/cancel", data={})
    actions = [r for r in caplog.records if getattr(r, "event", "") == "jobs.dashboard.action"]
    assert [(r.actor, r.action, r.scope) for r in actions] == [  # type: ignore[attr-defined]
        ("alice", "retry", "one"),
        ("alice", "retry", "filter"),
    ]
    assert actions[1].filter == {"state": "dead", "queue": "audit"}  # type: ignore[attr-defined]
    assert actions[1].affected == 2 and actions[1].remaining == 0  # type: ignore[attr-defined]
    refused = [r for r in caplog.records if getattr(r, "event", "") == "jobs.dashboard.refused"]
    assert [(r.actor, r.reason) for r in refused] == [("alice", "csrf")]  # type: ignore[attr-defined]


async def test_mounted_under_a_prefix_every_link_and_action_stays_under_it(
    driver: PostgresDriver,
) -> None:
    [dead] = await seed_dead(driver, 1, "default")
    inner = dashboard_app(driver, auth=lambda request: Actor(id="ops"))
    outer = Starlette(routes=[Mount("/ops/jobs-ui", inner)])
    async with serving(outer) as base, httpx.AsyncClient(base_url=base) as client:
        page = await client.get(f"/ops/jobs-ui/jobs/{dead}")
        assert page.status_code == 200
        links = re.findall(r'(?:href|src|action)="(/[^"]*)"', page.text)
        assert links and all(link.startswith("/ops/jobs-ui/") for link in links), links
        assert (await client.get("/ops/jobs-ui/static/dashboard.css")).status_code == 200
        moved = await client.post(
            f"/ops/jobs-ui/jobs/{dead}/retry", data={"csrf": csrf_of(page.text)}
        )
        assert moved.status_code == 303
        assert moved.headers["location"] == f"/ops/jobs-ui/jobs/{dead}?done=requeued"
        assert page.cookies.get("jobs_dashboard_csrf") or client.cookies.get("jobs_dashboard_csrf")
    assert (await introspect.get_job(driver, dead)).job.state == JobState.READY
