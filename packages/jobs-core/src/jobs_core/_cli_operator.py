"""The operator commands of ``jobsctl``: the CLI face of :mod:`jobs_core.introspect`.

``ls``, ``show``, ``retry``, ``cancel``, ``rm``, ``promote``, ``dead``, ``stats``, ``workers``,
``pause``, ``resume``, ``tasks``, ``resolve-step`` and ``manifest``.

Each is a thin layer over the introspection functions and runs against any driver URL
(``--driver``, or ``JOBS_DRIVER``). ``--app MODULE`` imports modules first (after the driver is
installed, so a module may enqueue at import): their declarations let ``show`` mask sensitive
input fields instead of hiding the whole input, and let ``tasks ls`` show each task's schedule.

People get rich tables; ``--json`` prints one JSON document on stdout for scripts, and bulk
commands show a progress bar only when stdout is a terminal and ``--json`` is off. Exit status:
0 done, 1 not found or a ``--check`` that failed, 2 a usage error or any other ``JobsError``
(its code and fix go to stderr).

:func:`add_operator_commands` takes an optional driver object used instead of ``--driver``: the
seam an embedding application or an in-process test uses; such a driver is never closed here.
A test-only environment switch inside the memory driver's factory was rejected: it would put a
test concern into production code paths.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from importlib.metadata import entry_points
from typing import Annotated, Any, NoReturn, TypeVar, cast

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from jobs_core import introspect
from jobs_core._current import install_driver
from jobs_core.cli import _exit_with, _import_apps, _open, _stderr
from jobs_core.driver import JobDriver
from jobs_core.errors import JobNotFoundError, JobsError
from jobs_core.introspect import JobQuery, JobView, TaskOverview, as_json
from jobs_core.job import REGISTRY
from jobs_core.task import TASK_REGISTRY, TaskHandle
from jobs_core.types import BulkResult, JobInfo, JobPage, JobState, StepRecord

T = TypeVar("T")

EXIT_FAILED = 1
"""The exit status when a job is not found or a ``--check`` fails."""

FACTORY_GROUP = "jobs.factories"
"""The entry-point group through which distributions register job factories."""

DriverOption = Annotated[
    str | None,
    typer.Option(
        "--driver",
        envvar="JOBS_DRIVER",
        help="The driver URL, e.g. postgresql://host/db (env JOBS_DRIVER).",
        show_default=False,
    ),
]
AppOption = Annotated[
    list[str] | None,
    typer.Option(
        "--app",
        help="A module to import first (repeatable): with its job declarations known, inputs "
        "are shown with only their sensitive fields masked.",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
QueueFilter = Annotated[
    str | None, typer.Option("--queue", help="Only this queue.", show_default=False)
]
NameFilter = Annotated[
    str | None, typer.Option("--name", help="Only this job name.", show_default=False)
]
LimitOption = Annotated[int, typer.Option("--limit", min=1, max=200, help="Rows per page.")]
AfterOption = Annotated[
    str | None,
    typer.Option("--after", help="A page's next cursor: list older rows.", show_default=False),
]
BeforeOption = Annotated[
    str | None,
    typer.Option("--before", help="A page's prev cursor: list newer rows.", show_default=False),
]
JobIdArgument = Annotated[str, typer.Argument(metavar="ID", help="The job id.")]
OptionalJobId = Annotated[
    str | None, typer.Argument(metavar="[ID]", help="The job id.", show_default=False)
]


def _console() -> Console:
    """Answer a stdout console; piped output gets room for full ids instead of 80 columns."""
    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 200
    return console


def _print_json(value: Any) -> None:
    typer.echo(json.dumps(as_json(value), indent=2, sort_keys=True))


def _when(value: datetime | None) -> str:
    return "" if value is None else value.isoformat(timespec="seconds")


def _usage(message: str) -> NoReturn:
    """Print a usage error and exit 2 (as typer does for a bad option)."""
    raise typer.BadParameter(message)


def _fail(error: JobsError, heading: str) -> NoReturn:
    """Print ``error`` with its code and fix; exit 1 when nothing was found, else 2."""
    try:
        _exit_with(error, heading)
    except typer.Exit:
        if isinstance(error, JobNotFoundError):
            raise typer.Exit(EXIT_FAILED) from None
        raise


class _Session:
    """How a command reaches its driver: the injected one, or one opened from ``--driver``."""

    def __init__(self, injected: JobDriver | None) -> None:
        self.injected = injected

    def run(
        self,
        url: str | None,
        apps: list[str] | None,
        heading: str,
        action: Callable[[JobDriver], Awaitable[T]],
    ) -> T:
        """Install the driver, import ``apps``, run ``action`` and close what was opened.

        The action and the close share one event loop: a driver's connections belong to the
        loop that opened them. A ``JobsError`` is printed and exits 1 or 2.
        """
        if self.injected is not None:
            driver = self.injected
        elif url:
            driver = _open(url)
            if driver.name == "memory":
                # The memory driver's rows live in the process that made them: without this
                # note an empty answer would read as the truth about a real queue.
                _stderr.print(
                    "[yellow]note:[/] memory:// sees only rows made in this process (by --app "
                    "modules); point --driver at a shared backend (postgresql://...) to operate "
                    "real queues"
                )
        else:
            _usage("name a driver with --driver URL or the JOBS_DRIVER environment variable")
        owned = driver is not self.injected
        install_driver(driver)
        try:
            try:
                _import_apps(apps or [])
            except typer.Exit:
                if owned:
                    asyncio.run(driver.close())
                raise
            try:
                return asyncio.run(_call(action, driver, close=owned))
            except JobsError as exc:
                _fail(exc, heading)
        finally:
            install_driver(None)


async def _call(
    action: Callable[[JobDriver], Awaitable[T]], driver: JobDriver, *, close: bool
) -> T:
    try:
        return await action(driver)
    finally:
        if close:
            await driver.close()


def _bulk(
    session: _Session,
    url: str | None,
    apps: list[str] | None,
    verb: str,
    call: Callable[[JobDriver], Awaitable[BulkResult]],
    as_json_output: bool,
) -> None:
    """Call a bulk operation until nothing remains (or a call changes nothing); report the sum.

    A call that changes nothing while rows remain (another process keeps putting them back)
    ends the loop, so the command always terminates.
    """
    console = _console()
    show_bar = console.is_terminal and not as_json_output

    async def loop(driver: JobDriver) -> BulkResult:
        done = 0
        with Progress(
            TextColumn(f"{verb}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=console,
            disable=not show_bar,
            transient=True,
        ) as progress:
            bar = progress.add_task(verb, total=None)
            while True:
                result = await call(driver)
                done += result.affected
                progress.update(bar, completed=done, total=done + result.remaining)
                if result.remaining == 0 or result.affected == 0:
                    return BulkResult(affected=done, remaining=result.remaining)

    total = session.run(url, apps, f"{verb} failed", loop)
    if as_json_output:
        _print_json(total)
    else:
        left = f", {total.remaining} left" if total.remaining else ""
        console.print(f"{verb}: {total.affected} job(s){left}")


OUTPUT_WIDTH = 60
"""How many characters of a step's output ``show`` prints (``--json`` prints it whole)."""

RESULT_WIDTH = 160
"""How many characters of a job's result ``show`` prints (``--json`` prints it whole)."""


def _cut(value: Any, width: int) -> str:
    """Answer ``value`` as compact JSON, cut to ``width`` characters with an ellipsis."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


def _attempt(job: JobInfo) -> str:
    """Answer ``n/max``: a running row's attempt in progress, else the attempts it spent.

    Rows count spent attempts; a running row is on the one after them.
    """
    current = job.attempt + 1 if job.state is JobState.RUNNING else job.attempt
    return f"{current}/{job.max_attempts}"


def _error_cell(job: JobInfo) -> str:
    """Answer the ERROR cell: a cancel's reason, a live or failed row's error; none when done.

    A row that completed after a failed attempt keeps that attempt's error (``show`` prints it
    as the earlier error); in a listing it would read as the reason the row is in trouble.
    """
    if job.state is JobState.DONE:
        return ""
    if job.state is JobState.CANCELLED:
        return (job.last_error or "")[:60]
    return job.last_error_code or (job.last_error or "")[:60]


def _tries(step: StepRecord) -> str:
    """Answer how many times a step's function ran (nothing for a sleep or an event wait).

    ``attempts`` counts the runs that raised; a completed step (or a once step under way) ran
    once more.
    """
    if step.status == "waiting":
        return ""
    return str(step.attempts + (0 if step.status == "failed" else 1))


def _jobs_table(page: JobPage) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("ID", "NAME", "QUEUE", "STATE", "ATTEMPT", "TENANT", "CREATED", "ERROR"):
        table.add_column(column, no_wrap=column in ("ID", "CREATED"))
    for row in page.rows:
        table.add_row(
            str(row.id),
            escape(row.name),
            escape(row.queue),
            row.state.value,
            _attempt(row),
            escape(row.tenant_id or ""),
            _when(row.created_at),
            escape(_error_cell(row)),
        )
    return table


def _print_page(page: JobPage, as_json_output: bool) -> None:
    if as_json_output:
        _print_json(page)
        return
    console = _console()
    if not page.rows:
        console.print("no jobs match")
        return
    console.print(_jobs_table(page))
    if page.next is not None:
        console.print(Text(f"older: --after {page.next}", "dim"))
    if page.prev is not None:
        console.print(Text(f"newer: --before {page.prev}", "dim"))


async def _job_and_children(driver: JobDriver, job_id: str) -> tuple[JobView, list[JobView]]:
    """Answer one job and the child jobs its run started (none without ``children``)."""
    view = await introspect.get_job(driver, job_id)
    if "children" not in driver.capabilities:
        return view, []
    return view, await introspect.children(driver, view.job.id)


def _show(view: JobView, children: list[JobView] | None = None) -> None:
    job = view.job
    console = _console()
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    fields: list[tuple[str, str]] = [
        ("id", str(job.id)),
        ("name", job.name),
        ("queue", job.queue),
        ("state", job.state.value),
        ("attempt", _attempt(job)),
        ("priority", str(job.priority)),
        ("run", str(job.run_id)),
        ("tenant", job.tenant_id or ""),
        ("key", job.idempotency_key),
        ("run at", _when(job.run_at)),
        ("created", _when(job.created_at)),
        ("updated", _when(job.updated_at)),
        ("claimed by", job.claimed_by or ""),
        ("enqueued by", job.enqueued_by or ""),
        ("traceparent", job.traceparent or ""),
        ("parent run", "" if job.parent_run_id is None else str(job.parent_run_id)),
    ]
    for label, value in fields:
        if value:
            head.add_row(label, escape(value))
    console.print(head)
    if job.progress is not None:
        console.print(Text.assemble(("progress ", "bold"), json.dumps(job.progress)))
    if job.state is JobState.DONE:
        console.print(Text.assemble(("result ", "bold"), _cut(job.result, RESULT_WIDTH)))
    if job.last_error is not None:
        code = f" ({job.last_error_code})" if job.last_error_code else ""
        label, style = {
            JobState.DONE: ("earlier error ", "bold yellow"),
            JobState.CANCELLED: ("cancelled ", "bold yellow"),
        }.get(job.state, ("error ", "bold red"))
        console.print(Text.assemble((label, style), job.last_error + code))
    if job.last_error_stack and job.state is not JobState.DONE:
        console.print(Text(job.last_error_stack.rstrip(), "dim"))
    if job.steps:
        steps = Table(title="steps", title_justify="left", box=None, header_style="bold")
        for column in ("#", "STEP", "STATUS", "ONCE", "TRIES", "STARTED", "DONE", "OUTPUT"):
            steps.add_column(column, overflow="fold" if column == "OUTPUT" else "ellipsis")
        steps.add_column("ERROR")
        for step in job.steps:
            steps.add_row(
                str(step.seq),
                escape(step.name),
                step.status,
                "yes" if step.once else "",
                _tries(step),
                _when(step.started_at),
                _when(step.completed_at),
                escape(_cut(step.output, OUTPUT_WIDTH)) if step.status == "completed" else "",
                escape(step.error or ""),
            )
        console.print(steps)
    if children:
        table = Table(title="children", title_justify="left", box=None, header_style="bold")
        for column in ("ID", "NAME", "STATE", "ATTEMPT", "ERROR"):
            table.add_column(column, no_wrap=column == "ID")
        for child in children:
            row = child.job
            table.add_row(
                str(row.id),
                escape(row.name),
                row.state.value,
                _attempt(row),
                escape(_error_cell(row)),
            )
        console.print(table)
    note = "" if view.declared else " (declaration not imported: pass --app MODULE)"
    console.print(Text.assemble(("input", "bold"), note))
    console.print(json.dumps(job.input, indent=2, sort_keys=True), markup=False)


def _done(console: Console, job: JobInfo, what: str) -> None:
    console.print(f"{what} {job.id} ({job.name}): now {job.state.value}")


@dataclass(frozen=True, slots=True)
class _GroupOptions:
    """The options given to a command group before its subcommand (``tasks --driver URL ls``).

    Attributes:
        driver_url: ``--driver`` (``None``: not given there).
        apps: ``--app`` modules (``None``: not given there).
        as_json: ``--json``.
    """

    driver_url: str | None = None
    apps: list[str] | None = None
    as_json: bool = False

    @staticmethod
    def of(ctx: typer.Context) -> _GroupOptions:
        """Answer the group's options from the subcommand's context (none when not given)."""
        found = ctx.parent.obj if ctx.parent is not None else None
        return found if isinstance(found, _GroupOptions) else _GroupOptions()

    def merge(
        self, ctx: typer.Context, driver_url: str | None, apps: list[str] | None, as_json: bool
    ) -> _GroupOptions:
        """Answer the subcommand's own options, each falling back on the group's.

        A ``--driver`` typed after the subcommand wins; one from ``JOBS_DRIVER`` does not
        override one typed before it.
        """
        # typer vendors click's ParameterSource privately: compared by name.
        source = ctx.get_parameter_source("driver_url")
        typed = getattr(source, "name", None) == "COMMANDLINE"
        return _GroupOptions(
            driver_url if typed or self.driver_url is None else self.driver_url,
            [*(self.apps or []), *(apps or [])] or None,
            as_json or self.as_json,
        )


def add_operator_commands(app: typer.Typer, *, driver: JobDriver | None = None) -> None:
    """Add the operator commands to ``app``.

    Args:
        app: the ``jobsctl`` typer app.
        driver: a driver every command uses instead of opening ``--driver`` (an embedding
            application's, or a test's); it is installed for ``--app`` imports and never
            closed here.
    """
    session = _Session(driver)

    @app.command("ls")
    def ls(
        queue: QueueFilter = None,
        state: Annotated[
            JobState | None, typer.Option("--state", help="Only this state.", show_default=False)
        ] = None,
        name: NameFilter = None,
        tenant: Annotated[
            str | None, typer.Option("--tenant", help="Only this tenant.", show_default=False)
        ] = None,
        limit: LimitOption = 50,
        after: AfterOption = None,
        before: BeforeOption = None,
        as_json_output: JsonOption = False,
        driver_url: DriverOption = None,
        apps: AppOption = None,
    ) -> None:
        """List jobs, newest first, one page at a time."""
        query: JobQuery = {}
        if queue is not None:
            query["queue"] = queue
        if state is not None:
            query["state"] = state
        if name is not None:
            query["name"] = name
        if tenant is not None:
            query["tenant_id"] = tenant
        page = session.run(
            driver_url,
            apps,
            "cannot list jobs",
            lambda d: introspect.list_jobs(d, limit=limit, after=after, before=before, **query),
        )
        _print_page(page, as_json_output)

    @app.command("dead")
    def dead(
        queue: QueueFilter = None,
        name: NameFilter = None,
        limit: LimitOption = 50,
        after: AfterOption = None,
        check: Annotated[
            bool, typer.Option("--check", help="Exit 1 when any dead job matches.")
        ] = False,
        as_json_output: JsonOption = False,
        driver_url: DriverOption = None,
        apps: AppOption = None,
    ) -> None:
        """List dead-lettered jobs (retry them with: jobsctl retry --all-dead)."""
        query: JobQuery = {"state": JobState.DEAD}
        if queue is not None:
            query["queue"] = queue
        if name is not None:
            query["name"] = name
        page = session.run(
            driver_url,
            apps,
            "cannot list dead jobs",
            lambda d: introspect.list_jobs(d, limit=limit, after=after, **query),
        )
        _print_page(page, as_json_output)
        if check and page.rows:
            raise typer.Exit(EXIT_FAILED)

    @app.command("show")
    def show(
        job_id: JobIdArgument,
        as_json_output: JsonOption = False,
        driver_url: DriverOption = None,
        apps: AppOption = None,
    ) -> None:
        """Show one job: steps, progress, last error, parent run, child jobs, redacted input."""
        view, children = session.run(
            driver_url, apps, "cannot show the job", lambda d: _job_and_children(d, job_id)
        )
        if as_json_output:
            shown = cast(dict[str, Any], as_json(view))
            shown["children"] = [
                {
                    "id": str(child.job.id),
                    "name": child.job.name,
                    "state": child.job.state.value,
                    "last_error_code": child.job.last_error_code,
                }
                for child in children
            ]
            # The table's TRIES, for scripts too (a step's ``attempts`` counts its failures).
            for step, record in zip(shown["job"]["steps"], view.job.steps, strict=True):
                step["tries"] = None if record.status == "waiting" else int(_tries(record))
            typer.echo(json.dumps(shown, indent=2, sort_keys=True))
        else:
            _show(view, children)

    @app.command("retry")
    def retry(
        job_id: OptionalJobId = None,
        from_step: Annotated[
            str | None,
            typer.Option(
                "--from-step",
                help="Delete this step and every later one, so the run replays from it.",
                show_default=False,
            ),
        ] = None,
        all_dead: Annotated[
            bool, typer.Option("--all-dead", help="Requeue every dead job (with the filters).")
        ] = False,
        queue: QueueFilter = None,
        name: NameFilter = None,
        as_json_output: JsonOption = False,
        driver_url: DriverOption = None,
        apps: AppOption = None,
    ) -> None:
        """Requeue a finished job (dead, failed, cancelled or done), or every dead one."""
        if all_dead:
            if job_id is not None or from_step is not None:
                _usage("--all-dead takes no ID and no --from-step")
            query: JobQuery = {"state": JobState.DEAD}
            if queue is not None:
                query["queue"] = queue
            if name is not None:
                query["name"] = name
            _bulk(
                session,
                driver_url,
                apps,
                "requeued",
                lambda d: introspect.requeue_many(d, **query),
                as_json_output,
            )
            return
        if job_id is None:
            _usage("name a job ID, or pass --all-dead")
        job = session.run(
            driver_url,
            apps,
            "cannot requeue the job",
            lambda d: introspect.requeue(d, job_id, from_step=from_step),
        )
        if as_json_output:
            _print_json(introspect.redact_job(job))
        else:
            _done(_console(), job, "requeued")

    @app.command("cancel")
    def cancel(
        job_id: JobIdArgument,
        reason: Annotated[
            str, typer.Option("--reason", help="Stored as the job's last error.")
        ] = "cancelled by an operator",
        as_json_output: JsonOption = False,
        driver_url: DriverOption = None,
        apps: AppOption = None,
    ) -> None:
        """Cancel a live job (a running one stops at its worker's next heartbeat)."""
        job = session.run(
            driver_url,
            apps,
            "cannot cancel the job",
            lambda d: introspect.cancel(d, job_id, reason),
        )
        if as_json_output:
            _print_json(introspect.redact_job(job))
        else:
            _done(_console(), job, "cancelled")

    @app.command("rm")
    def rm(
        job_id: OptionalJobId = None,
        all_dead: Annotated[
            bool, typer.Option("--all-dead", help="Remove every dead job (with the filters).")
        ] = False,
        queue: QueueFilter = None,
        name: NameFilter = None,
        as_json_output: JsonOption = False,
        driver_url: DriverOption = None,
        apps: AppOption = None,
    ) -> None:
        """Remove a job that is not running, with its steps; or every dead one."""
        if all_dead:
            if job_id is not None:
                _usage("--all-dead takes no ID")
            query: JobQuery = {"state": JobState.DEAD}
            if queue is not None:
                query["queue"] = queue
            if name is not None:
                query["name"] = name
            _bulk(
                session,
                driver_url,
                apps,
                "removed",
                lambda d: introspect.remove_many(d, **query),
                as_json_output,
            )
            return
        if job_id is None:
            _usage("name a job ID, or pass --all-dead")
        session.run(
            driver_url, apps, "cannot remove the job", lambda d: introspect.remove(d, job_id)
        )
        if as_json_output:
            _print_json({"removed": job_id})
        else:
            _console().print(f"removed {job_id}")

    @app.command("promote")
    def promote(
        job_id: OptionalJobId = None,
        everything: Annotated[
            bool, typer.Option("--all", help="Promote every waiting job (with the filters).")
        ] = False,
        queue: QueueFilter = None,
        name: NameFilter = None,
        as_json_output: JsonOption = False,
        driver_url: DriverOption = None,
        apps: AppOption = None,
    ) -> None:
        """Make a job waiting on its run_at (delayed or suspended) due now; or every one."""
        if everything:
            if job_id is not None:
                _usage("--all takes no ID")
            query: JobQuery = {}
            if queue is not None:
                query["queue"] = queue
            if name is not None:
                query["name"] = name
            _bulk(
                session,
                driver_url,
                apps,
                "promoted",
                lambda d: introspect.promote_many(d, **query),
                as_json_output,
            )
            return
        if job_id is None:
            _usage("name a job ID, or pass --all")
        job = session.run(
            driver_url, apps, "cannot promote the job", lambda d: introspect.promote(d, job_id)
        )
        if as_json_output:
            _print_json(introspect.redact_job(job))
        else:
            _done(_console(), job, "promoted")

    @app.command("stats")
    def stats(
        as_json_output: JsonOption = False,
        driver_url: DriverOption = None,
        apps: AppOption = None,
    ) -> None:
        """Show every queue's counts, demand, oldest due job and pause state."""
        overview = session.run(driver_url, apps, "cannot read stats", introspect.stats)
        if as_json_output:
            _print_json(overview)
            return
        console = _console()
        if not overview:
            console.print("no queues yet")
            return
        table = Table(box=None, header_style="bold", pad_edge=False)
        columns = ("QUEUE", "READY", "DELAYED", "RUNNING", "SUSPENDED", "DONE", "FAILED")
        for column in (*columns, "DEAD", "CANCELLED", "OLDEST", "DEMAND", "PAUSED"):
            table.add_column(column, justify="left" if column == "QUEUE" else "right")
        for row in overview:
            s = row.stats
            table.add_row(
                escape(s.queue),
                *(
                    str(n)
                    for n in (s.ready, s.delayed, s.running, s.suspended, s.done, s.failed, s.dead)
                ),
                str(s.cancelled),
                # No due row has waited: a dash, not a "0.0s" that reads as a measurement.
                f"{s.oldest_ready_ms / 1000:.1f}s" if s.ready or s.oldest_ready_ms else "-",
                str(row.demand),
                {True: "paused", False: "", None: "?"}[row.paused],
            )
        console.print(table)

    @app.command("workers")
    def workers(
        as_json_output: JsonOption = False,
        driver_url: DriverOption = None,
        apps: AppOption = None,
    ) -> None:
        """List live workers: host, build, queues, slots, jobs in flight, last heartbeat."""
        found = session.run(driver_url, apps, "cannot list workers", introspect.workers)
        if as_json_output:
            _print_json(found)
            return
        console = _console()
        if not found:
            console.print("no live workers")
            return
        table = Table(box=None, header_style="bold", pad_edge=False)
        for column in ("ID", "HOST", "BUILD", "QUEUES", "SLOTS", "IN FLIGHT", "STARTED"):
            table.add_column(column)
        table.add_column("LAST BEAT")
        table.add_column("DRAINING")
        for w in found:
            table.add_row(
                escape(w.id),
                escape(w.host),
                escape(w.build),
                escape(",".join(w.queues)),
                str(w.slots),
                str(len(w.in_flight)),
                _when(w.started_at),
                _when(w.last_heartbeat),
                _when(w.draining_at),
            )
        console.print(table)

    @app.command("pause")
    def pause(
        queue: Annotated[str, typer.Argument(metavar="QUEUE", help="The queue to pause.")],
        as_json_output: JsonOption = False,
        driver_url: DriverOption = None,
        apps: AppOption = None,
    ) -> None:
        """Pause a queue: no worker claims from it (enqueues still land)."""

        async def act(d: JobDriver) -> list[str]:
            await introspect.pause_queue(d, queue)
            return await introspect.paused_queues(d)

        paused = session.run(driver_url, apps, "cannot pause the queue", act)
        if as_json_output:
            _print_json({"paused": paused})
        else:
            _console().print(f"paused {queue} (paused now: {', '.join(paused)})")

    @app.command("resume")
    def resume(
        queue: Annotated[str, typer.Argument(metavar="QUEUE", help="The queue to resume.")],
        as_json_output: JsonOption = False,
        driver_url: DriverOption = None,
        apps: AppOption = None,
    ) -> None:
        """Resume a paused queue."""

        async def act(d: JobDriver) -> list[str]:
            await introspect.resume_queue(d, queue)
            return await introspect.paused_queues(d)

        paused = session.run(driver_url, apps, "cannot resume the queue", act)
        if as_json_output:
            _print_json({"paused": paused})
        else:
            still = ", ".join(paused) or "none"
            _console().print(f"resumed {queue} (paused now: {still})")

    @app.command("resolve-step")
    def resolve_step(
        job_id: JobIdArgument,
        step: Annotated[str, typer.Argument(metavar="STEP", help="The once step's name.")],
        ran: Annotated[
            bool, typer.Option("--ran", help="Its effect happened: record it completed.")
        ] = False,
        not_ran: Annotated[
            bool, typer.Option("--not-ran", help="It did not happen: the next attempt runs it.")
        ] = False,
        output: Annotated[
            str | None,
            typer.Option("--output", help="With --ran: the step's output as JSON."),
        ] = None,
        as_json_output: JsonOption = False,
        driver_url: DriverOption = None,
        apps: AppOption = None,
    ) -> None:
        """Settle a once step whose outcome is unknown (X_STEP_OUTCOME_UNKNOWN)."""
        if ran == not_ran:
            _usage("pass exactly one of --ran and --not-ran")
        if output is not None and not ran:
            _usage("--output goes with --ran")
        value: Any = None
        if output is not None:
            try:
                value = json.loads(output)
            except ValueError as exc:
                _usage(f"--output is not JSON: {exc}")
        session.run(
            driver_url,
            apps,
            "cannot resolve the step",
            lambda d: introspect.resolve_step(d, job_id, step, ran=ran, output=value),
        )
        if as_json_output:
            _print_json({"job_id": job_id, "step": step, "ran": ran})
        else:
            verdict = "completed" if ran else "deleted (the next attempt runs it)"
            _console().print(f"step {step!r} of {job_id}: {verdict}; now: jobsctl retry {job_id}")

    tasks_app = typer.Typer(
        name="tasks",
        help="Cron tasks: list them, pause or resume one. --driver, --app and --json may come "
        "before the subcommand too.",
        invoke_without_command=True,
        no_args_is_help=False,
    )

    @tasks_app.callback()
    def tasks_default(
        ctx: typer.Context,
        as_json_output: JsonOption = False,
        driver_url: DriverOption = None,
        apps: AppOption = None,
    ) -> None:
        """List the tasks when no subcommand is given."""
        # ``jobsctl tasks --driver URL ls``: the subcommand falls back on these.
        ctx.obj = _GroupOptions(driver_url, apps, as_json_output)
        if ctx.invoked_subcommand is None:
            _list_tasks(session, driver_url, apps, as_json_output)

    @tasks_app.command("ls")
    def tasks_ls(
        ctx: typer.Context,
        as_json_output: JsonOption = False,
        driver_url: DriverOption = None,
        apps: AppOption = None,
    ) -> None:
        """List tasks: schedule, watermark, last fire, pause state."""
        given = _GroupOptions.of(ctx).merge(ctx, driver_url, apps, as_json_output)
        _list_tasks(session, given.driver_url, given.apps, given.as_json)

    @tasks_app.command("pause")
    def tasks_pause(
        ctx: typer.Context,
        task: Annotated[str, typer.Argument(metavar="TASK", help="The task name.")],
        as_json_output: JsonOption = False,
        driver_url: DriverOption = None,
        apps: AppOption = None,
    ) -> None:
        """Pause a task: the scheduler does not dispatch it."""
        given = _GroupOptions.of(ctx).merge(ctx, driver_url, apps, as_json_output)

        async def act(d: JobDriver) -> list[str]:
            await introspect.pause_task(d, task)
            return await introspect.paused_tasks(d)

        paused = session.run(given.driver_url, given.apps, "cannot pause the task", act)
        if given.as_json:
            _print_json({"paused": paused})
        else:
            _console().print(f"paused task {task}")

    @tasks_app.command("resume")
    def tasks_resume(
        ctx: typer.Context,
        task: Annotated[str, typer.Argument(metavar="TASK", help="The task name.")],
        as_json_output: JsonOption = False,
        driver_url: DriverOption = None,
        apps: AppOption = None,
    ) -> None:
        """Resume a paused task; its catch-up policy decides what was missed."""
        given = _GroupOptions.of(ctx).merge(ctx, driver_url, apps, as_json_output)

        async def act(d: JobDriver) -> list[str]:
            await introspect.resume_task(d, task)
            return await introspect.paused_tasks(d)

        paused = session.run(given.driver_url, given.apps, "cannot resume the task", act)
        if given.as_json:
            _print_json({"paused": paused})
        else:
            _console().print(f"resumed task {task}")

    app.add_typer(tasks_app)

    @app.command("manifest")
    def manifest(
        apps: Annotated[
            list[str] | None,
            typer.Argument(
                metavar="APP...",
                help="Modules that declare jobs and tasks (the current directory first).",
                show_default=False,
            ),
        ] = None,
        as_json_output: JsonOption = False,
    ) -> None:
        """List every job and task APP declares and every installed job factory."""
        _import_apps(apps or [])
        entries: list[dict[str, Any]] = [handle.describe() for handle in REGISTRY.all()]
        entries += [handle.describe() for handle in TASK_REGISTRY.all()]
        for ep in sorted(entry_points(group=FACTORY_GROUP), key=lambda ep: ep.name):
            entries.append(
                {
                    "kind": "factory",
                    "name": ep.name,
                    "value": ep.value,
                    "distribution": None if ep.dist is None else ep.dist.name,
                }
            )
        if as_json_output:
            _print_json(entries)
            return
        console = _console()
        table = Table(box=None, header_style="bold", pad_edge=False)
        for column in ("KIND", "NAME", "WHERE", "DETAILS"):
            table.add_column(column)
        for entry in entries:
            table.add_row(entry["kind"], escape(entry["name"]), *_manifest_cells(entry))
        console.print(table if entries else "nothing declared")


def _manifest_cells(entry: dict[str, Any]) -> tuple[str, str]:
    """Answer the WHERE and DETAILS cells of a manifest row."""
    if entry["kind"] == "job":
        retry = entry["retry"]
        details = f"attempts={retry['attempts']} backoff={retry['backoff']}"
        if entry["compensates"]:
            details += " compensates"
        return f"queue {entry['queue']}", details
    if entry["kind"] == "task":
        return f"{entry['cron']} {entry['tz']}", f"catch_up={entry['catch_up']}"
    return escape(entry["value"]), escape(entry["distribution"] or "")


def _schedule(
    handle: TaskHandle | None, state: TaskOverview | None
) -> tuple[str | None, str | None]:
    """Answer a task's cron and zone: as ``--app`` declares it, else as its last fire kept it."""
    if handle is not None:
        return handle.cron, handle.tz
    fire = None if state is None else state.last_fire
    if fire is None:
        return None, None
    return fire.cron, fire.tz


def _list_tasks(
    session: _Session, url: str | None, apps: list[str] | None, as_json_output: bool
) -> None:
    found = session.run(url, apps, "cannot list tasks", introspect.tasks)
    declared = {handle.name: handle for handle in TASK_REGISTRY.all()}
    names = sorted({t.task for t in found} | set(declared))
    known = {t.task: t for t in found}
    if as_json_output:
        rows = []
        for name in names:
            state = known.get(name)
            cron, tz = _schedule(declared.get(name), state)
            rows.append(
                {
                    "task": name,
                    "cron": cron,
                    "tz": tz,
                    "watermark": None if state is None else as_json(state.watermark),
                    "last_fire": None if state is None else as_json(state.last_fire),
                    "paused": state is not None and state.paused,
                }
            )
        _print_json(rows)
        return
    console = _console()
    if not names:
        console.print("no tasks known (declare them in --app, or run a scheduler)")
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("TASK", "SCHEDULE", "WATERMARK", "LAST FIRE", "PAUSED"):
        table.add_column(column)
    for name in names:
        state = known.get(name)
        cron, tz = _schedule(declared.get(name), state)
        table.add_row(
            escape(name),
            "" if cron is None else escape(f"{cron} {tz or ''}".strip()),
            "" if state is None else _when(state.watermark),
            "" if state is None or state.last_fire is None else _when(state.last_fire.fired_at),
            "paused" if state is not None and state.paused else "",
        )
    console.print(table)
