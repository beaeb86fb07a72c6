"""The ``jobsctl`` command: run the demo, a worker, or a development worker.

Built on typer. :func:`create_app` builds the command tree: the built-in commands, then one group
per ``jobs.cli`` entry point, whose value is a callable ``(app: typer.Typer) -> None`` that adds
its commands (``jobsctl pg migrate`` comes from jobs-pg this way). Entry points are loaded when the
CLI starts, not when this module is imported, each on its own: one that fails to load or register
becomes a command of its name that explains the failure and exits 2, so a broken plugin never
takes ``jobsctl worker`` down with it.

Logs go to stderr through :class:`~jobs_core.logs.LineHandler`, one line per record (``--log-format
text``, the default, or ``json``), showing the structured fields the library attaches
(``extra={"event": "jobs.…", ...}``). Errors the user can fix (an APP that does not import, a
``JobsError``) are printed with their code and fix, and exit with status 2.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import Annotated, Any, NoReturn, Protocol

import typer
from rich.console import Console
from rich.text import Text

from jobs_core import REGISTRY, JobDriver, JobsError, Worker, install_driver, open_driver
from jobs_core.driver import Migratable, OutboxStore, capability, preflight, redact_url
from jobs_core.errors import JobOptionsInvalidError, NotImplementedByDriverError
from jobs_core.logs import LogFormat, LogLevel, configure_logging
from jobs_core.metrics import JobsMetrics, MetricsServer
from jobs_core.outbox import Relay, installed_outbox
from jobs_core.scheduler import Scheduler
from jobs_core.task import TASK_REGISTRY
from jobs_core.worker import DEFAULT_CONCURRENCY

ENTRY_POINT_GROUP = "jobs.cli"
"""The entry-point group through which sibling distributions add commands."""

EXIT_USAGE = 2
"""The exit status for an error the user can fix (bad APP, bad option, unknown driver, ...)."""

_log = logging.getLogger("jobs.cli")
_stderr = Console(stderr=True)


def _exit_with(
    error: BaseException, heading: str, *, trace: bool = False, fix: str | None = None
) -> NoReturn:
    """Print an error the user can fix and exit 2.

    A ``JobsError`` shows its code, message and fix (``fix`` replaces the registry's generic one
    when the command knows better); another error its type and message, or with ``trace`` the
    traceback from the first frame outside the import machinery.
    """
    if isinstance(error, JobsError):
        _stderr.print(Text.assemble(("error ", "bold red"), (error.code, "bold"), f": {heading}"))
        _stderr.print(Text(error.message), soft_wrap=True)
        if fix or error.fix:
            _stderr.print(Text.assemble(("fix: ", "bold"), fix or error.fix), soft_wrap=True)
    else:
        _stderr.print(Text.assemble(("error", "bold red"), f": {heading}"), soft_wrap=True)
        detail = _app_traceback(error) if trace else f"{type(error).__name__}: {error}"
        _stderr.print(Text(detail.rstrip()), soft_wrap=True)
        if fix:
            _stderr.print(Text.assemble(("fix: ", "bold"), fix), soft_wrap=True)
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
                module = app.removesuffix(".py").replace(os.sep, ".").strip(".")
                _exit_with(
                    exc,
                    f"APP {app!r} is not an importable module (searched from {cwd})",
                    fix=f"APP is a module path, not a file: pass {module!r}"
                    if app.endswith(".py")
                    else "pass the dotted module path (package.module) that declares the jobs, "
                    "run from the directory it is importable from",
                )
            # The module exists but raised while importing: show where.
            _exit_with(exc, f"importing APP {app!r} failed", trace=True)


def _open(url: str) -> JobDriver:
    """Open the driver for ``url``, or exit 2 naming the problem."""
    try:
        return open_driver(url)
    except JobsError as exc:
        _exit_with(exc, f"cannot open the driver {redact_url(url)!r}")


def _queue_list(queues: str | None) -> list[str]:
    """Answer ``--queues a,b`` as a list, or every queue a declared job uses."""
    if queues is not None:
        named = [q.strip() for q in queues.split(",") if q.strip()]
        if named:
            return list(dict.fromkeys(named))
    return sorted({handle.queue for handle in REGISTRY.all()}) or ["default"]


class _Role(Protocol):
    """A long-running role that ``jobsctl dev`` runs beside its worker (scheduler, relay)."""

    async def run(self) -> None: ...

    async def stop(self) -> None: ...


def _dev_roles(driver: JobDriver) -> list[_Role]:
    """Answer the roles ``jobsctl dev`` runs beside the worker, built after APP was imported.

    The scheduler runs when APP declares tasks (the driver must carry ``scheduler_state``); a
    relay runs when APP installed an outbox (:func:`~jobs_core.outbox.install_outbox`), which is
    how a memory outbox gets published at all.

    Raises:
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` when APP declares tasks and the
            driver keeps no scheduler state.
    """
    roles: list[_Role] = []
    if TASK_REGISTRY.all():
        roles.append(Scheduler(driver))
    outbox = installed_outbox()
    if outbox is not None:
        roles.append(outbox.relay())
    return roles


async def _serve(
    driver: JobDriver,
    *,
    queues: list[str],
    concurrency: int,
    visibility_timeout: str,
    drain_timeout: str,
    roles: Callable[[JobDriver], Sequence[_Role]] | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    build: str = "",
    cancel_grace: str = "5s",
) -> None:
    """Run a worker until a SIGTERM or SIGINT drain (or a stop) ends it, then close the driver.

    With ``metrics_port`` the worker records into its own :class:`JobsMetrics`, served over HTTP
    on ``metrics_host:metrics_port`` until the worker returns.

    ``cancel_grace`` is how long an async body whose job an operator cancelled may go on before
    its task is cancelled (a duration such as ``"5s"``).

    ``roles`` builds companions (``jobsctl dev``: the scheduler) that run beside the worker; a
    signal stops them while the worker drains, and they are stopped when it returns.

    Raises:
        JobsError: the worker's options are bad (``X_JOB_OPTIONS_INVALID``) or it cannot run
            (e.g. ``X_JOB_CONCURRENCY_UNENFORCEABLE``), or a role cannot be built.
    """
    loop = asyncio.get_running_loop()
    # Held here: the loop keeps only weak references to tasks.
    companions: list[asyncio.Task[None]] = []
    stopping: list[asyncio.Task[None]] = []
    built: Sequence[_Role] = ()
    server: MetricsServer | None = None
    try:
        # Before the banner: a worker that cannot serve (schema not migrated) says so and exits.
        await preflight(driver)
        built = roles(driver) if roles is not None else ()
        metrics = JobsMetrics() if metrics_port is not None else None
        worker = Worker(
            driver,
            queues=queues,
            concurrency=concurrency,
            visibility_timeout=visibility_timeout,
            drain_timeout=drain_timeout,
            cancel_grace=cancel_grace,
            build=build,
            metrics=metrics,
        )
        if metrics is not None and metrics_port is not None:
            server = _serve_metrics(metrics, metrics_port, metrics_host)

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
            stopping.extend(loop.create_task(role.stop()) for role in built)

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal, signum)
        running = loop.create_task(worker.run())
        companions.extend(loop.create_task(role.run()) for role in built)
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
        if companions:
            await asyncio.gather(*(role.stop() for role in built), *stopping)
            await asyncio.gather(*companions)
        if server is not None:
            server.close()
        await driver.close()


def _serve_metrics(metrics: JobsMetrics, port: int, host: str) -> MetricsServer:
    """Serve ``metrics`` on ``host:port`` and log where.

    Raises:
        JobOptionsInvalidError: ``X_JOB_OPTIONS_INVALID`` when the address cannot be bound.
    """
    try:
        server = metrics.serve(port, host)
    except OSError as exc:
        raise JobOptionsInvalidError(
            f"--metrics-port: cannot serve metrics on {host}:{port}: {exc}", option="metrics_port"
        ) from None
    _log.info(
        "jobs.metrics.serving",
        extra={"event": "jobs.metrics.serving", "host": server.host, "port": server.port},
    )
    return server


def _run_worker(
    apps: list[str],
    driver_url: str,
    queues: str | None,
    concurrency: int,
    visibility_timeout: str,
    drain_timeout: str,
    log_level: LogLevel,
    log_format: LogFormat,
    roles: Callable[[JobDriver], Sequence[_Role]] | None = None,
    **serve_options: Any,
) -> None:
    """Open and install the driver, import the APPs, run a worker and ``roles`` until it drains.

    ``serve_options`` go to :func:`_serve` (``metrics_port``, ``metrics_host``, ``build``,
    ``cancel_grace``).
    """
    configure_logging(log_level, log_format)
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
                roles=roles,
                **serve_options,
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
    int,
    typer.Option(
        "--concurrency",
        min=1,
        help="Jobs run at once, per queue. The default suits I/O-bound async bodies; CPU-bound "
        "or sync (threaded) bodies want about the cores or the threads they can use.",
    ),
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
CancelGraceOption = Annotated[
    str,
    typer.Option(
        "--cancel-grace",
        help="After an operator cancels a running job, how long its async body may go on "
        "before its task is cancelled (a sync body cannot be stopped and runs on).",
    ),
]
LogLevelOption = Annotated[
    LogLevel,
    typer.Option("--log-level", help="The least severe log records shown (on stderr)."),
]
LogFormatOption = Annotated[
    LogFormat,
    typer.Option(
        "--log-format",
        envvar="JOBS_LOG_FORMAT",
        help="Log lines as readable text or as JSON objects, one a line (for a log collector).",
    ),
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
    concurrency: ConcurrencyOption = DEFAULT_CONCURRENCY,
    visibility_timeout: VisibilityOption = "30s",
    drain_timeout: DrainOption = "25s",
    cancel_grace: CancelGraceOption = "5s",
    log_level: LogLevelOption = LogLevel.INFO,
    log_format: LogFormatOption = LogFormat.TEXT,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=0,
            max=65535,
            help="Serve Prometheus metrics on this port (GET /metrics).",
            show_default=False,
        ),
    ] = None,
    metrics_bind: Annotated[
        str,
        typer.Option("--metrics-bind", help="The address the metrics server binds."),
    ] = "127.0.0.1",
    build: Annotated[
        str,
        typer.Option(
            "--build",
            envvar="JOBS_BUILD",
            help="The app's build or version, shown by jobsctl workers.",
        ),
    ] = "",
) -> None:
    """Run a worker for the jobs APP declares until SIGTERM or SIGINT drains it."""
    _run_worker(
        apps,
        driver,
        queues,
        concurrency,
        visibility_timeout,
        drain_timeout,
        log_level,
        log_format,
        metrics_port=metrics_port,
        metrics_host=metrics_bind,
        build=build,
        cancel_grace=cancel_grace,
    )


def dev(
    apps: AppsArgument,
    driver: Annotated[
        str, typer.Option("--driver", help="The driver URL (in-memory unless you name one).")
    ] = "memory://",
    queues: QueuesOption = None,
    concurrency: ConcurrencyOption = DEFAULT_CONCURRENCY,
    visibility_timeout: VisibilityOption = "30s",
    drain_timeout: DrainOption = "25s",
    log_level: LogLevelOption = LogLevel.INFO,
    log_format: LogFormatOption = LogFormat.TEXT,
) -> None:
    """Run a worker for APP, and the scheduler for its tasks, on an in-memory driver.

    The driver is installed before APP is imported, so a module that enqueues at import time
    feeds the worker. The scheduler runs when APP declares tasks.
    """
    _run_worker(
        apps,
        driver,
        queues,
        concurrency,
        visibility_timeout,
        drain_timeout,
        log_level,
        log_format,
        roles=_dev_roles,
    )


async def _serve_scheduler(driver: JobDriver, *, tick: str, leader_ttl: str) -> None:
    """Run a scheduler until SIGTERM or SIGINT, then release its lease and close the driver.

    Raises:
        JobsError: a bad option (``X_JOB_OPTIONS_INVALID``) or a driver without scheduler
            state (``X_NOT_IMPLEMENTED``).
    """
    loop = asyncio.get_running_loop()
    handled = False
    try:
        await preflight(driver)
        runner = Scheduler(driver, tick=tick, leader_ttl=leader_ttl)
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, runner.request_stop)
        handled = True
        _log.info(
            "jobs.scheduler.started",
            extra={
                "event": "jobs.scheduler.started",
                "holder": runner.holder_id,
                "driver": driver.name,
                "tasks": sorted(runner.tasks),
                "elected": runner.leader is not None,
            },
        )
        await runner.run()
        _log.info(
            "jobs.scheduler.stopped",
            extra={"event": "jobs.scheduler.stopped", "holder": runner.holder_id},
        )
    finally:
        if handled:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
        await driver.close()


def scheduler(
    apps: AppsArgument,
    driver: Annotated[
        str,
        typer.Option(
            "--driver",
            envvar="JOBS_DRIVER",
            help="The driver URL whose scheduler state and leader lease are used, e.g. "
            "postgresql://host/db.",
            show_default=False,
        ),
    ],
    tick: Annotated[
        str, typer.Option("--tick", help="The longest sleep between scheduler rounds.")
    ] = "1s",
    leader_ttl: Annotated[
        str,
        typer.Option(
            "--leader-ttl",
            help="How long the leader lease lives; renewed every third of it. A standby takes "
            "over within about this long after the leader stops.",
        ),
    ] = "30s",
    log_level: LogLevelOption = LogLevel.INFO,
    log_format: LogFormatOption = LogFormat.TEXT,
) -> None:
    """Fire the cron tasks APP declares until SIGTERM or SIGINT.

    Run as many as you like: one leads at a time, and each occurrence fires once.
    """
    configure_logging(log_level, log_format)
    opened = _open(driver)
    install_driver(opened)
    try:
        try:
            _import_apps(apps)
        except typer.Exit:
            asyncio.run(opened.close())
            raise
        if not TASK_REGISTRY.all():
            asyncio.run(opened.close())
            _stderr.print(
                Text.assemble(
                    ("error", "bold red"),
                    f": APP ({', '.join(apps)}) declares no tasks, so there is nothing to schedule",
                ),
                soft_wrap=True,
            )
            _stderr.print(Text("fix: name the modules that call task(...)"), soft_wrap=True)
            raise typer.Exit(EXIT_USAGE)
        asyncio.run(_serve_scheduler(opened, tick=tick, leader_ttl=leader_ttl))
    except JobsError as exc:
        _exit_with(exc, "the scheduler cannot run")
    finally:
        install_driver(None)


def demo(
    driver: Annotated[
        str, typer.Option("--driver", help="The driver URL the demo runs on.")
    ] = "memory://",
    log_level: LogLevelOption = LogLevel.WARNING,
    log_format: LogFormatOption = LogFormat.TEXT,
) -> None:
    """Run the guided demo: a shop's jobs on a real worker, narrated and checked (~3 s).

    Exits 0 when every job ended as the story says, 1 otherwise.
    """
    from jobs_core.demo.run import run_demo

    configure_logging(log_level, log_format)
    opened = _open(driver)
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        # Piped (CI, nox): rich would assume 80 columns and squeeze the tables.
        console.width = 120

    async def main() -> bool:
        try:
            if isinstance(opened, Migratable):
                await opened.migrate()
            return await run_demo(opened, console)
        finally:
            await opened.close()

    try:
        ok = asyncio.run(main())
    except JobsError as exc:
        _exit_with(exc, "the demo cannot run")
    raise typer.Exit(0 if ok else 1)


async def _serve_relay(
    driver: JobDriver,
    store: OutboxStore,
    *,
    batch: int,
    claim_lease: str,
    poll_interval: str,
    exclusive: bool = True,
) -> None:
    """Run a relay from ``store`` to ``driver`` until SIGTERM or SIGINT, then close the driver.

    Raises:
        JobOptionsInvalidError: ``X_JOB_OPTIONS_INVALID`` for a bad relay option.
    """
    loop = asyncio.get_running_loop()
    handled = False
    try:
        await preflight(driver)
        relay = Relay(
            store,
            driver,
            batch=batch,
            claim_lease=claim_lease,
            poll_interval=poll_interval,
            exclusive=exclusive,
        )
        # Held here: the loop keeps only weak references to tasks.
        stopping: list[asyncio.Task[None]] = []
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, lambda: stopping.append(loop.create_task(relay.stop())))
        handled = True
        _log.info(
            "jobs.relay.started",
            extra={"event": "jobs.relay.started", "relay_id": relay.id, "driver": driver.name},
        )
        await relay.run()
        _log.info("jobs.relay.stopped", extra={"event": "jobs.relay.stopped", "relay_id": relay.id})
    finally:
        if handled:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
        await driver.close()


def relay(
    driver: Annotated[
        str,
        typer.Option(
            "--driver",
            envvar="JOBS_DRIVER",
            help="The driver URL whose outbox is published, e.g. postgresql://host/db. Not "
            "memory://: a memory outbox lives in the app's own process, so run "
            "Relay(store, driver) in-process there.",
            show_default=False,
        ),
    ],
    apps: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="APP",
            help="Modules to import first (e.g. ones that configure logging or register "
            "drivers); the relay needs no job declarations.",
            show_default=False,
        ),
    ] = None,
    batch: Annotated[
        int, typer.Option("--batch", min=1, max=1000, help="Rows claimed and published per pass.")
    ] = 100,
    claim_lease: Annotated[
        str,
        typer.Option(
            "--claim-lease",
            help="How long a pass holds its rows before another relay may take them over.",
        ),
    ] = "30s",
    poll_interval: Annotated[
        str,
        typer.Option(
            "--poll-interval", help="The pause after a pass that found less than a full batch."
        ),
    ] = "1s",
    exclusive: Annotated[
        bool,
        typer.Option(
            "--exclusive/--side-by-side",
            help="Exclusive: one relay publishes at a time (the store's relay lease; a second "
            "one takes over when it lapses), in global staging order. Side by side: relays "
            "publish together, in order per order_key only.",
        ),
    ] = True,
    log_level: LogLevelOption = LogLevel.INFO,
    log_format: LogFormatOption = LogFormat.TEXT,
) -> None:
    """Publish committed outbox rows to the driver until SIGTERM or SIGINT.

    Rows are published in staging order, each onto the job id its enqueue answered, so running
    two relays (or restarting one mid-batch) never makes a second job. The memory driver's outbox
    is in-process only: this command refuses memory://.
    """
    configure_logging(log_level, log_format)
    opened = _open(driver)
    store = capability(opened, "outbox")
    # A memory outbox lives in the process that staged into it: a relay process of its own would
    # watch an empty store forever.
    if store is None or opened.name == "memory":
        asyncio.run(opened.close())
        _exit_with(
            NotImplementedByDriverError(
                f"the {opened.name} driver carries no shared outbox store, so a separate relay "
                "process has nothing to publish",
                driver=opened.name,
                capability="outbox",
            ),
            "the relay cannot run",
            fix="Point --driver at a driver with an outbox (postgresql://...); a memory outbox "
            "lives in the app's process: run Relay(store, driver) there.",
        )
    install_driver(opened)
    try:
        try:
            _import_apps(apps or [])
        except typer.Exit:
            asyncio.run(opened.close())
            raise
        asyncio.run(
            _serve_relay(
                opened,
                store,
                batch=batch,
                claim_lease=claim_lease,
                poll_interval=poll_interval,
                exclusive=exclusive,
            )
        )
    except JobsError as exc:
        _exit_with(exc, "the relay cannot run")
    finally:
        install_driver(None)


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


def create_app(*, plugins: bool = True, driver: JobDriver | None = None) -> typer.Typer:
    """Build the ``jobsctl`` command tree.

    Args:
        plugins: also load the ``jobs.cli`` entry points (see :func:`load_plugins`).
        driver: a driver the operator commands (``ls``, ``show``, ``retry``, ...) use instead
            of opening ``--driver``: an embedding application's, or a test's. It is never
            closed by them.

    Returns:
        A fresh typer app; each call builds a new one.
    """
    app = typer.Typer(
        name="jobsctl",
        help="Durable background jobs: run workers, operate queues and jobs, and the guided demo.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    app.command("demo")(demo)
    app.command("worker")(worker)
    app.command("dev")(dev)
    app.command("scheduler")(scheduler)
    app.command("relay")(relay)
    # Imported here: the operator module builds on this one's helpers.
    from jobs_core._cli_backfill import add_backfill_commands
    from jobs_core._cli_enqueue import add_enqueue_command
    from jobs_core._cli_operator import add_operator_commands

    add_enqueue_command(app, driver=driver)
    add_operator_commands(app, driver=driver)
    add_backfill_commands(app, driver=driver)
    if plugins:
        load_plugins(app)
    return app


def main() -> None:
    """Run the ``jobsctl`` command (the console-script entry point)."""
    create_app()(prog_name="jobsctl")


if __name__ == "__main__":
    main()
