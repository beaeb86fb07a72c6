"""The ``jobs`` command: run the demo, a worker, or a development worker.

Built on typer. :func:`create_app` builds the command tree: the built-in commands, then one group
per ``jobs.cli`` entry point, whose value is a callable ``(app: typer.Typer) -> None`` that adds
its commands (``jobs pg migrate`` comes from jobs-pg this way). Entry points are loaded when the
CLI starts, not when this module is imported, each on its own: one that fails to load or register
becomes a command of its name that explains the failure and exits 2, so a broken plugin never
takes ``jobs worker`` down with it.

Logs go to stderr through :class:`RichLogHandler`, one readable line per record, showing the
structured fields the library attaches (``extra={"event": "jobs.…", ...}``). Errors the user can
fix (an APP that does not import, a ``JobsError``) are printed with their code and fix, and exit
with status 2.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable, Mapping
from datetime import datetime
from enum import StrEnum
from importlib.metadata import EntryPoint, entry_points
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from jobs_core import REGISTRY, JobDriver, JobsError, Worker, install_driver, open_driver

ENTRY_POINT_GROUP = "jobs.cli"
"""The entry-point group through which sibling distributions add commands."""

EXIT_USAGE = 2
"""The exit status for an error the user can fix (bad APP, bad option, unknown driver, ...)."""

_LEVEL_STYLES = {
    logging.DEBUG: "dim",
    logging.INFO: "green",
    logging.WARNING: "yellow",
    logging.ERROR: "bold red",
    logging.CRITICAL: "bold white on red",
}

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_RECORD_ATTRIBUTES = frozenset(
    logging.LogRecord("", logging.INFO, "", 0, "", None, None).__dict__
) | {"message", "asctime", "taskName"}


class LogLevel(StrEnum):
    """The ``--log-level`` choices."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class RichLogHandler(logging.Handler):
    """Render each log record as one readable line on a rich console.

    The library logs structured records whose message is an event name (``jobs.lease.lost``)
    and whose ``extra=`` fields say what it concerns. A line shows the local time, the level, the
    event (or the logger and message for other records) and every extra field as ``key=value``;
    a record's exception follows as a traceback.

    Args:
        console: where the lines go (stderr in the CLI).
        level: the least severe level shown.
    """

    def __init__(self, console: Console, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        """Print ``record`` (and its traceback, if it carries one)."""
        try:
            self.console.print(self.render(record), soft_wrap=True, highlight=False)
            if record.exc_info is not None:
                self.console.print(
                    Text("".join(traceback.format_exception(*record.exc_info)), "dim"),
                    soft_wrap=True,
                    highlight=False,
                )
        except Exception:
            self.handleError(record)

    def render(self, record: logging.LogRecord) -> Text:
        """Answer the line for ``record``: time, level, event or message, extra fields."""
        at = datetime.fromtimestamp(record.created).strftime("%H:%M:%S.%f")[:-3]
        level_style = _LEVEL_STYLES.get(record.levelno, "")
        line = Text.assemble((at, "dim"), " ", (f"{record.levelname:<7}", level_style), " ")
        fields = {k: v for k, v in record.__dict__.items() if k not in _RECORD_ATTRIBUTES}
        event = fields.pop("event", None)
        message = record.getMessage()
        if event is not None:
            line.append(str(event), "bold cyan")
            if message != event:
                line.append(f" {message}")
        else:
            line.append(f"{record.name}: ", "cyan")
            line.append(message)
        for key, value in fields.items():
            line.append(f" {key}=", "dim")
            line.append(_field_text(value))
        return line


def _field_text(value: object) -> str:
    if isinstance(value, Mapping):
        return json.dumps(value, separators=(",", ":"), default=str)
    if isinstance(value, list | tuple | set | frozenset):
        return ",".join(str(item) for item in value)
    text = str(value)
    return repr(text) if not text or any(ch.isspace() for ch in text) else text


def configure_logging(level: LogLevel, console: Console) -> None:
    """Send every log record at ``level`` or above to ``console`` through :class:`RichLogHandler`.

    Replaces the handlers a previous call installed, so calling it twice does not print twice.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, RichLogHandler):
            root.removeHandler(handler)
    numeric = logging.getLevelNamesMapping()[level.value.upper()]
    root.addHandler(RichLogHandler(console, numeric))
    root.setLevel(numeric)


_log = logging.getLogger("jobs.cli")
_stderr = Console(stderr=True)


def _exit_with(error: BaseException, heading: str, *, trace: bool = False) -> NoReturn:
    """Print an error the user can fix and exit 2.

    A ``JobsError`` shows its code, message and fix; another error its type and message, or with
    ``trace`` the traceback from the first frame outside the import machinery.
    """
    if isinstance(error, JobsError):
        _stderr.print(Text.assemble(("error ", "bold red"), (error.code, "bold"), f": {heading}"))
        _stderr.print(Text(error.message), soft_wrap=True)
        if error.fix:
            _stderr.print(Text.assemble(("fix: ", "bold"), error.fix), soft_wrap=True)
    else:
        _stderr.print(Text.assemble(("error", "bold red"), f": {heading}"), soft_wrap=True)
        detail = _app_traceback(error) if trace else f"{type(error).__name__}: {error}"
        _stderr.print(Text(detail.rstrip()), soft_wrap=True)
    raise typer.Exit(EXIT_USAGE)


def _app_traceback(error: BaseException) -> str:
    """Format ``error``'s traceback without the leading frames of this module and importlib."""
    machinery = (__file__, importlib.__file__)
    tb = error.__traceback__
    while tb is not None and (
        tb.tb_frame.f_code.co_filename in machinery
        or tb.tb_frame.f_code.co_filename.startswith("<frozen importlib")
    ):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(error), error, tb))


def _import_apps(apps: list[str]) -> None:
    """Import every APP module (the current directory first on ``sys.path``), or exit 2."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    for app in apps:
        try:
            importlib.import_module(app)
        except Exception as exc:
            missing = isinstance(exc, ModuleNotFoundError) and (
                exc.name == app or app.startswith(f"{exc.name}.")
            )
            if missing:
                _exit_with(exc, f"APP {app!r} is not an importable module (searched from {cwd})")
            # The module exists but raised while importing: show where.
            _exit_with(exc, f"importing APP {app!r} failed", trace=True)


def _open(url: str) -> JobDriver:
    """Open the driver for ``url``, or exit 2 naming the problem."""
    try:
        return open_driver(url)
    except JobsError as exc:
        _exit_with(exc, f"cannot open the driver {url!r}")


def _queue_list(queues: str | None) -> list[str]:
    """Answer ``--queues a,b`` as a list, or every queue a declared job uses."""
    if queues is not None:
        named = [q.strip() for q in queues.split(",") if q.strip()]
        if named:
            return list(dict.fromkeys(named))
    return sorted({handle.queue for handle in REGISTRY.all()}) or ["default"]


async def _serve(
    driver: JobDriver,
    *,
    queues: list[str],
    concurrency: int,
    visibility_timeout: str,
    drain_timeout: str,
) -> None:
    """Run a worker until a SIGTERM or SIGINT drain (or a stop) ends it, then close the driver.

    Raises:
        JobsError: the worker's options are bad (``X_JOB_OPTIONS_INVALID``) or it cannot run
            (e.g. ``X_JOB_CONCURRENCY_UNENFORCEABLE``).
    """
    loop = asyncio.get_running_loop()
    try:
        worker = Worker(
            driver,
            queues=queues,
            concurrency=concurrency,
            visibility_timeout=visibility_timeout,
            drain_timeout=drain_timeout,
        )

        def on_signal(signum: signal.Signals) -> None:
            _log.info(
                "jobs.worker.draining",
                extra={
                    "event": "jobs.worker.draining",
                    "signal": signum.name,
                    "in_flight": worker.stats().in_flight,
                    "drain_timeout_ms": worker.drain_timeout_ms,
                },
            )
            worker.request_drain()

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal, signum)
        running = loop.create_task(worker.run())
        _log.info(
            "jobs.worker.started",
            extra={
                "event": "jobs.worker.started",
                "worker_id": worker.id,
                "driver": driver.name,
                "queues": worker.queues,
                "concurrency": worker.slots,
                "jobs": [handle.name for handle in worker.registry.all()],
            },
        )
        await running
        _log.info(
            "jobs.worker.stopped",
            extra={
                "event": "jobs.worker.stopped",
                "worker_id": worker.id,
                **worker.stats().outcomes,
            },
        )
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await driver.close()


def _run_worker(
    apps: list[str],
    driver_url: str,
    queues: str | None,
    concurrency: int,
    visibility_timeout: str,
    drain_timeout: str,
    log_level: LogLevel,
) -> None:
    """Open and install the driver, import the APPs, run a worker until it drains."""
    configure_logging(log_level, _stderr)
    driver = _open(driver_url)
    # Installed before the APPs are imported, so code that enqueues at import time has a driver.
    install_driver(driver)
    try:
        try:
            _import_apps(apps)
        except typer.Exit:
            asyncio.run(driver.close())
            raise
        asyncio.run(
            _serve(
                driver,
                queues=_queue_list(queues),
                concurrency=concurrency,
                visibility_timeout=visibility_timeout,
                drain_timeout=drain_timeout,
            )
        )
    except JobsError as exc:
        _exit_with(exc, "the worker cannot run")
    finally:
        install_driver(None)


AppsArgument = Annotated[
    list[str],
    typer.Argument(
        metavar="APP",
        help="Importable module paths that declare the jobs (e.g. myapp.jobs); the current "
        "directory is searched first.",
        show_default=False,
    ),
]
QueuesOption = Annotated[
    str | None,
    typer.Option(
        "--queues",
        help="Comma-separated queues to serve. Default: every queue a job of APP uses.",
        show_default=False,
    ),
]
ConcurrencyOption = Annotated[
    int, typer.Option("--concurrency", min=1, help="Jobs run at once, per queue.")
]
VisibilityOption = Annotated[
    str,
    typer.Option(
        "--visibility-timeout",
        help="The lease each claim buys; renewed every third of it while the job runs.",
    ),
]
DrainOption = Annotated[
    str,
    typer.Option(
        "--drain-timeout",
        help="On SIGTERM/SIGINT, how long running jobs get to stop before their leases are "
        "left to lapse.",
    ),
]
LogLevelOption = Annotated[
    LogLevel,
    typer.Option("--log-level", help="The least severe log records shown (on stderr)."),
]


def worker(
    apps: AppsArgument,
    driver: Annotated[
        str,
        typer.Option(
            "--driver",
            envvar="JOBS_DRIVER",
            help="The driver URL, e.g. postgresql://host/db, redis://host:6379/0 or memory://.",
            show_default=False,
        ),
    ],
    queues: QueuesOption = None,
    concurrency: ConcurrencyOption = 8,
    visibility_timeout: VisibilityOption = "30s",
    drain_timeout: DrainOption = "25s",
    log_level: LogLevelOption = LogLevel.INFO,
) -> None:
    """Run a worker for the jobs APP declares until SIGTERM or SIGINT drains it."""
    _run_worker(apps, driver, queues, concurrency, visibility_timeout, drain_timeout, log_level)


def dev(
    apps: AppsArgument,
    driver: Annotated[
        str, typer.Option("--driver", help="The driver URL (in-memory unless you name one).")
    ] = "memory://",
    queues: QueuesOption = None,
    concurrency: ConcurrencyOption = 8,
    visibility_timeout: VisibilityOption = "30s",
    drain_timeout: DrainOption = "25s",
    log_level: LogLevelOption = LogLevel.INFO,
) -> None:
    """Run a worker for APP on an in-memory driver for local development.

    The driver is installed before APP is imported, so a module that enqueues at import time
    feeds the worker.
    """
    _run_worker(apps, driver, queues, concurrency, visibility_timeout, drain_timeout, log_level)


def demo(
    driver: Annotated[
        str, typer.Option("--driver", help="The driver URL the demo runs on.")
    ] = "memory://",
    log_level: LogLevelOption = LogLevel.WARNING,
) -> None:
    """Run the guided demo: a shop's jobs on a real worker, narrated and checked (~3 s).

    Exits 0 when every job ended as the story says, 1 otherwise.
    """
    from jobs_core.demo.run import run_demo

    configure_logging(log_level, _stderr)
    opened = _open(driver)
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        # Piped (CI, nox): rich would assume 80 columns and squeeze the tables.
        console.width = 120

    async def main() -> bool:
        try:
            return await run_demo(opened, console)
        finally:
            await opened.close()

    try:
        ok = asyncio.run(main())
    except JobsError as exc:
        _exit_with(exc, "the demo cannot run")
    raise typer.Exit(0 if ok else 1)


def _broken_plugin(app: typer.Typer, ep: EntryPoint, error: Exception) -> None:
    """Register ``ep.name`` as a command that explains why its plugin did not load."""
    source = ep.dist.name if ep.dist is not None else ep.value
    summary = f"{type(error).__name__}: {error}"

    def unavailable() -> None:
        _stderr.print(
            Text.assemble(
                ("error", "bold red"),
                f": the {ep.name!r} commands (from {source}) failed to load: {summary}",
            ),
            soft_wrap=True,
        )
        _stderr.print(
            Text(f"fix: reinstall or upgrade {source}; its entry point is {ep.value}"),
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_USAGE)

    app.command(
        name=ep.name,
        help=f"Unavailable: {source} failed to load ({summary}).",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        add_help_option=False,
    )(unavailable)


def load_plugins(app: typer.Typer) -> None:
    """Let every ``jobs.cli`` entry point add its commands to ``app``.

    Each entry point's value is a callable taking ``app``. One that fails to import or to
    register is replaced by a command of its name that reports the failure and exits 2.
    """
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            register: Callable[[typer.Typer], None] = ep.load()
            register(app)
        except Exception as exc:
            _broken_plugin(app, ep, exc)


def create_app(*, plugins: bool = True) -> typer.Typer:
    """Build the ``jobs`` command tree.

    Args:
        plugins: also load the ``jobs.cli`` entry points (see :func:`load_plugins`).

    Returns:
        A fresh typer app; each call builds a new one.
    """
    app = typer.Typer(
        name="jobs",
        help="Durable background jobs: run workers, and the guided demo.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    app.command("demo")(demo)
    app.command("worker")(worker)
    app.command("dev")(dev)
    if plugins:
        load_plugins(app)
    return app


def main() -> None:
    """Run the ``jobs`` command (the console-script entry point)."""
    create_app()(prog_name="jobs")


if __name__ == "__main__":
    main()
