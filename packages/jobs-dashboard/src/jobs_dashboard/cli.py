"""``jobsctl dashboard``: serve the dashboard alone over one driver URL.

Registered through the ``jobs.cli`` entry point (:func:`register`). The server is uvicorn on
``--host`` (loopback by default) and ``--port``. Access is HTTP Basic with one user: the password
comes from ``--password``/``JOBS_DASHBOARD_PASSWORD``, or is drawn at random and printed once at
start (an open dashboard by default was rejected: River UI ships without auth, and a port left
open on a shared host then lets anyone cancel jobs). ``--auth module:attr`` uses your own hook
instead.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import secrets
import sys
from typing import Annotated

import typer
import uvicorn
from rich.console import Console

from jobs_core import install_driver, open_driver
from jobs_core.errors import JobsError
from jobs_core.logs import LogLevel, configure_logging
from jobs_dashboard._app import dashboard_app
from jobs_dashboard._security import AuthHook, basic_auth

_stderr = Console(stderr=True)


def _fail(heading: str, error: BaseException) -> typer.Exit:
    if isinstance(error, JobsError):
        typer.echo(f"error {error.code}: {heading}: {error.message}", err=True)
        if error.fix:
            typer.echo(f"fix: {error.fix}", err=True)
    else:
        typer.echo(f"error: {heading}: {type(error).__name__}: {error}", err=True)
    return typer.Exit(2)


def _import(modules: list[str]) -> None:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for module in modules:
        importlib.import_module(module)


def _hook(spec: str) -> AuthHook:
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise typer.BadParameter("--auth takes module:attribute, e.g. myapp.auth:dashboard_actor")
    hook: AuthHook = getattr(importlib.import_module(module), attr)
    if not callable(hook):
        raise typer.BadParameter(f"{spec} is not callable")
    return hook


def dashboard(
    driver: Annotated[
        str,
        typer.Option(
            "--driver",
            envvar="JOBS_DRIVER",
            help="The driver URL, e.g. postgresql://host/db (env JOBS_DRIVER).",
            show_default=False,
        ),
    ],
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="TCP port.")] = 8080,
    host: Annotated[
        str, typer.Option("--host", help="Address to bind (0.0.0.0 exposes it).")
    ] = "127.0.0.1",
    read_only: Annotated[
        bool, typer.Option("--read-only", help="Hide every action and refuse each (403).")
    ] = False,
    apps: Annotated[
        list[str] | None,
        typer.Option(
            "--app",
            help="A module declaring jobs and tasks (repeatable): inputs are then shown with only "
            "their sensitive fields masked, and task schedules are known.",
            show_default=False,
        ),
    ] = None,
    user: Annotated[
        str, typer.Option("--user", envvar="JOBS_DASHBOARD_USER", help="The Basic auth user.")
    ] = "admin",
    password: Annotated[
        str | None,
        typer.Option(
            "--password",
            envvar="JOBS_DASHBOARD_PASSWORD",
            help="The Basic auth password (default: a random one, printed at start).",
            show_default=False,
        ),
    ] = None,
    auth: Annotated[
        str | None,
        typer.Option(
            "--auth",
            help="module:attr of your own auth hook (request) -> Actor | None, instead of Basic.",
            show_default=False,
        ),
    ] = None,
    secret: Annotated[
        str | None,
        typer.Option(
            "--secret",
            envvar="JOBS_DASHBOARD_SECRET",
            help="The CSRF key; share it between replicas (default: random).",
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[
        LogLevel, typer.Option("--log-level", help="Least severe log level shown.")
    ] = LogLevel.INFO,
) -> None:
    """Serve the operator dashboard: queues, jobs, steps, dead letters, workers, cron tasks."""
    configure_logging(log_level)
    drawn = password is None and auth is None
    chosen_password = secrets.token_urlsafe(12) if password is None else password
    try:
        hook = _hook(auth) if auth else basic_auth(user, chosen_password)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None

    async def serve() -> None:
        opened = open_driver(driver)
        install_driver(opened)
        try:
            _import(apps or [])
            app = dashboard_app(opened, auth=hook, read_only=read_only, secret=secret)
            # Open tabs poll every second: on SIGTERM they get 5 s, then their sockets close.
            config = uvicorn.Config(
                app,
                host=host,
                port=port,
                lifespan="off",
                log_level=log_level.value,
                timeout_graceful_shutdown=5,
            )
            where = f"http://{host}:{port}/"
            who = f"user {user}, password {chosen_password}" if drawn else "your auth hook"
            if not auth and not drawn:
                who = f"user {user} (password as given)"
            mode = " read-only" if read_only else ""
            _stderr.print(
                f"jobs dashboard{mode} on {where} over {opened.name}; sign in: {who}",
                soft_wrap=True,
                markup=False,
                highlight=False,
            )
            await uvicorn.Server(config).serve()
        finally:
            install_driver(None)
            await opened.close()

    try:
        asyncio.run(serve())
    except (JobsError, ImportError) as exc:
        raise _fail("cannot serve the dashboard", exc) from None


def register(app: typer.Typer) -> None:
    """Add ``jobsctl dashboard`` to the ``jobsctl`` app (the ``jobs.cli`` entry point)."""
    app.command("dashboard")(dashboard)
