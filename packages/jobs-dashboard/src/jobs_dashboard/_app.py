"""``dashboard_app()``: the Starlette app, its routes, and what every response shares.

Layers, outermost first: the auth :class:`~jobs_dashboard._security.Guard` (401 for everything,
static files included), the response headers (CSP, ``Server-Timing``), then the router. Pages and
actions live in :mod:`jobs_dashboard._pages` and :mod:`jobs_dashboard._actions`; both reach the
driver only through :mod:`jobs_core.introspect`, so the dashboard works on every driver that
carries the capability a page needs and says plainly which one is missing otherwise.

Links are written from the path the dashboard is mounted at (the ASGI ``root_path`` when a
request enters it), not with ``request.url_for``: inside a mounted app Starlette resolves route
names against the outermost router, which does not know ours.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jobs_core.clock import SYSTEM_CLOCK, Clock
from jobs_core.driver import JobDriver, capability
from jobs_core.errors import (
    DriverUnavailableError,
    JobNotFoundError,
    JobsError,
    NotImplementedByDriverError,
)
from jobs_core.job import JobRegistry
from jobs_core.task import TaskRegistry
from jobs_core.tenancy import Actor
from jobs_dashboard import _format
from jobs_dashboard._security import SECURITY_HEADERS, AuthHook, Csrf, Guard

PAGE_CAPABILITIES = {
    "introspect": "listing jobs, one job's page and every job or queue action",
    "counters": "the throughput and failure chart",
    "workers": "the workers page",
    "scheduler_state": "the cron tasks' fires, watermarks and pauses",
}
"""What each optional capability the dashboard reads gives; shown when a driver lacks one."""

_CONFLICT_CODES = frozenset(
    {
        "X_JOB_NOT_CANCELLABLE",
        "X_JOB_NOT_REQUEUEABLE",
        "X_JOB_NOT_REMOVABLE",
        "X_JOB_NOT_PROMOTABLE",
        "X_JOB_DUPLICATE",
        "X_STEP_NOT_RESOLVABLE",
    }
)


@dataclass(frozen=True, slots=True)
class Dashboard:
    """What the pages and actions of one dashboard share.

    Attributes:
        driver: the driver every page reads through :mod:`jobs_core.introspect`.
        read_only: hide and refuse every action.
        csrf: the CSRF token issuer.
        env: the Jinja2 environment (autoescaping on).
        registry: job declarations redaction reads (``None``: every declared job).
        task_registry: task declarations the cron page reads (``None``: every declared task).
        redact_keys: keys masked anywhere (``None``: ``introspect.REDACT_KEYS``).
        clock: ages and next fires are measured on it.
        title: the page title.
    """

    driver: JobDriver
    read_only: bool
    csrf: Csrf
    env: jinja2.Environment
    registry: JobRegistry | None
    task_registry: TaskRegistry | None
    redact_keys: frozenset[str] | None
    clock: Clock
    title: str

    def carries(self, name: str) -> bool:
        """Answer whether the driver declares capability ``name``."""
        return capability(self.driver, name) is not None

    def missing(self, name: str) -> str:
        """Answer the sentence a page shows where the driver lacks capability ``name``."""
        return (
            f"The {self.driver.name} driver does not carry the {name!r} capability, so "
            f"{PAGE_CAPABILITIES[name]} cannot be shown here."
        )

    def render(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> HTMLResponse:
        """Render ``template`` with the shared context; set the CSRF cookie when it is new."""
        actor: Actor = request.state.actor
        nonce, new = self.csrf.nonce(request)
        base: str = request.state.base
        for name in ("notice", "error", "missing", "next", "prev", "page"):
            context.setdefault(name, None)
        html = self.env.get_template(template).render(
            request=request,
            base=base,
            actor=actor,
            read_only=self.read_only,
            csrf=self.csrf.token(nonce, actor),
            driver=self.driver,
            dash=self,
            title=self.title,
            **context,
        )
        response = HTMLResponse(html, status)
        if new:
            self.csrf.set_cookie(response, nonce, base or "/")
        return response

    def failure(self, request: Request, error: JobsError) -> HTMLResponse:
        """Render a ``JobsError`` with its code, message and fix, under a fitting status."""
        if isinstance(error, JobNotFoundError):
            status = 404
        elif isinstance(error, NotImplementedByDriverError):
            status = 501
        elif isinstance(error, DriverUnavailableError):
            status = 503
        elif error.code in _CONFLICT_CODES:
            status = 409
        else:
            status = 400
        return self.render(request, "error.html", status, error=error)


class _Headers:
    """ASGI middleware: add the security headers and ``Server-Timing`` to every response.

    ``Server-Timing: app;dur=<ms>`` is the time from the request's arrival to the response's
    start, which for a page is the whole handler (reads and rendering): what ``bench/`` reads.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        scope.setdefault("state", {})["base"] = scope.get("root_path", "").rstrip("/")

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                took = (time.perf_counter() - started) * 1000
                headers = [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                headers.append((b"server-timing", f"app;dur={took:.2f}".encode()))
                names = {k for k, _ in headers}
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                message = {**message, "headers": kept + headers}
            await send(message)

        await self.app(scope, receive, sending)


def dashboard_app(
    driver: JobDriver,
    *,
    auth: AuthHook,
    read_only: bool = False,
    secret: str | bytes | None = None,
    registry: JobRegistry | None = None,
    task_registry: TaskRegistry | None = None,
    redact_keys: Iterable[str] | None = None,
    clock: Clock = SYSTEM_CLOCK,
    title: str = "jobs",
) -> ASGIApp:
    """Answer the dashboard as an ASGI app, to mount in FastAPI/Starlette or serve alone.

    Every page and action goes through :mod:`jobs_core.introspect`; a page whose capability the
    driver lacks says so instead of failing. The app does not own ``driver`` (it never closes it).

    Args:
        driver: an open driver (pg, memory, redis, or any third-party one).
        auth: ``(request) -> Actor | None``, sync or async, called on every request (static files
            included); ``None`` answers 401. There is no default: pass :func:`basic_auth`, your
            app's own session check, or ``lambda request: Actor(id="anyone")`` on purpose.
        read_only: hide every action and refuse each with 403.
        secret: the CSRF HMAC key; share one between replicas (default: random per process).
        registry: the job declarations whose sensitive input fields are masked (default: every
            declared job; an undeclared job's input shows ``"[redacted]"`` whole).
        task_registry: the cron declarations whose schedules the tasks page shows.
        redact_keys: keys masked anywhere (default ``introspect.REDACT_KEYS``).
        clock: what ages and next fires are measured on.
        title: the page title.

    Returns:
        An ASGI app. Mounted at a prefix, it writes every link under that prefix.

    Each action is a POST carrying a CSRF token, logged as ``jobs.dashboard.action`` with the
    actor's id, the targets, the filter and the counts (never a payload).
    """
    from jobs_dashboard._actions import Actions
    from jobs_dashboard._pages import Pages

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("jobs_dashboard", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    _format.install(env)
    dash = Dashboard(
        driver=driver,
        read_only=read_only,
        csrf=Csrf(secret),
        env=env,
        registry=registry,
        task_registry=task_registry,
        redact_keys=None if redact_keys is None else frozenset(redact_keys),
        clock=clock,
        title=title,
    )
    pages = Pages(dash)
    actions = Actions(dash)
    routes = [
        Route("/", pages.overview, methods=["GET"]),
        Route("/jobs", pages.jobs, methods=["GET"]),
        Route("/dead", pages.dead, methods=["GET"]),
        Route("/jobs/{job_id}", pages.job, methods=["GET"]),
        Route("/workers", pages.workers, methods=["GET"]),
        Route("/tasks", pages.tasks, methods=["GET"]),
        Route("/jobs/{job_id}/{action}", actions.job, methods=["POST"]),
        Route("/bulk", actions.bulk, methods=["POST"]),
        Route("/queues/{action}", actions.queues, methods=["POST"]),
        Route("/tasks/{action}", actions.tasks, methods=["POST"]),
        Mount("/static", StaticFiles(packages=[("jobs_dashboard", "static")]), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={404: _not_found})
    app.state.dashboard = dash
    return _Headers(Guard(app, auth))


async def _not_found(request: Request, exc: Exception) -> Response:
    dash: Dashboard = request.app.state.dashboard
    return dash.render(request, "error.html", 404, error=None)
