"""``jobsctl backfill``: the dry run, the enqueue, every backfill at once, and the deploy gate.

* ``jobsctl backfill NAME`` is a dry run: the rows to do, the pages and the least time the
  throttle allows, the checksum a new pass would record, the ledger's newest pass, and what
  ``--write`` would do (run, skip because a pass completed, or refuse and why). Nothing is written.
* ``--write`` enqueues the pass (a worker runs it; the command never runs one inline).
* ``--all`` does the same for every declared backfill, each on its own: one that fails (a
  pending migration, an unknown environment, a driver error) is reported and the rest go on;
  the exit status is 1 when any failed.
* ``--pending`` lists the declared backfills without a completed pass and exits 1 when there is
  one (a deploy gate: ``jobsctl backfill --pending --app app || exit 1``).

Scoped backfills (declared with ``input`` + ``scope``) take ``--input JSON``; ``--all`` and
``--pending`` leave them out (they have no fixed set of scopes) and say so.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from jobs_core._cli_operator import (
    EXIT_FAILED,
    AppOption,
    DriverOption,
    JsonOption,
    _console,
    _print_json,
    _Session,
    _usage,
    _when,
)
from jobs_core.driver import JobDriver
from jobs_core.errors import JobsError
from jobs_core.factories.backfill import (
    BackfillJob,
    BackfillPlan,
    pending_backfills,
    registered_backfills,
)
from jobs_core.introspect import as_json
from jobs_core.types import BackfillPass


def _pass_text(found: BackfillPass | None) -> str:
    if found is None:
        return ""
    return f"{found.status} {found.rows:,} rows, begun {_when(found.started_at)} ({found.id})"


def _plan_table(plans: list[BackfillPlan]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("BACKFILL", "SCOPE", "ROWS", "PAGES", "AT RATE", "WOULD", "NEWEST PASS"):
        table.add_column(column)
    for plan in plans:
        would = plan.would if plan.refusal is None else f"refuse: {plan.refusal}"
        table.add_row(
            escape(plan.name),
            escape(plan.scope),
            "?" if plan.count is None else f"{plan.count:,}",
            "?" if plan.pages is None else f"{plan.pages:,} x {plan.batch:,}",
            "" if plan.seconds is None else f">= {plan.seconds:,.1f} s at {plan.rate:g}/s",
            escape(would),
            escape(_pass_text(plan.latest)),
        )
    return table


def _plan_json(plan: BackfillPlan) -> Any:
    return {**as_json(plan), "would": plan.would}


def _find(name: str) -> BackfillJob:
    declared = {b.name: b for b in registered_backfills()}
    found = declared.get(name)
    if found is None:
        known = ", ".join(sorted(declared)) or "none: name the modules that declare them (--app)"
        _usage(f"no backfill is named {name!r}; declared: {known}")
    return found


def _input(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        _usage(f"--input is not JSON: {exc}")


def add_backfill_commands(app: typer.Typer, *, driver: JobDriver | None = None) -> None:
    """Add ``backfill`` to ``app`` (its driver: ``driver`` if given, else ``--driver``)."""
    session = _Session(driver)

    @app.command("backfill")
    def backfill(
        name: Annotated[
            str | None,
            typer.Argument(metavar="[NAME]", help="The backfill.", show_default=False),
        ] = None,
        write: Annotated[
            bool, typer.Option("--write", help="Enqueue the pass (a worker runs it).")
        ] = False,
        every: Annotated[
            bool, typer.Option("--all", help="Every declared backfill, each on its own.")
        ] = False,
        pending: Annotated[
            bool,
            typer.Option("--pending", help="List backfills with no completed pass; exit 1 if any."),
        ] = False,
        force: Annotated[
            bool, typer.Option("--force", help="With --write: run even after a completed pass.")
        ] = False,
        input_text: Annotated[
            str | None,
            typer.Option("--input", help="A scoped backfill's input, as JSON.", show_default=False),
        ] = None,
        as_json_output: JsonOption = False,
        driver_url: DriverOption = None,
        apps: AppOption = None,
    ) -> None:
        """Dry-run a backfill, enqueue it (--write), do all (--all) or gate a deploy (--pending)."""
        if pending:
            _pending(session, driver_url, apps, as_json_output)
            return
        if every:
            if name is not None:
                _usage("give a NAME or --all, not both")
            _all(session, driver_url, apps, write, force, as_json_output)
            return
        if name is None:
            _usage("name a backfill, or pass --all or --pending")
        value = _input(input_text)

        async def act(d: JobDriver) -> Any:
            found = _find(name)
            if write:
                result = await found.enqueue(value, force=force)
                return {"name": found.name, **as_json(result)}
            return await found.plan(value, driver=d)

        answer = session.run(driver_url, apps, f"backfill {name} failed", act)
        if isinstance(answer, BackfillPlan):
            if as_json_output:
                _print_json(_plan_json(answer))
            else:
                console = _console()
                console.print(_plan_table([answer]))
                console.print(f"checksum {answer.checksum}")
                if answer.completed is not None:
                    console.print(f"completed pass: {escape(_pass_text(answer.completed))}")
        elif as_json_output:
            _print_json(answer)
        else:
            state = "a live pass answered (deduped)" if answer["deduped"] else "enqueued"
            _console().print(f"backfill {escape(answer['name'])}: {state}, job {answer['id']}")


def _pending(
    session: _Session, url: str | None, apps: list[str] | None, as_json_output: bool
) -> None:
    async def act(d: JobDriver) -> tuple[list[str], list[str]]:
        found = await pending_backfills(d)
        scoped = [b.name for b in registered_backfills() if b.scoped]
        return [b.name for b in found], scoped

    names, scoped = session.run(url, apps, "cannot read the backfill ledger", act)
    if as_json_output:
        _print_json({"pending": names, "scoped": scoped})
    else:
        console = _console()
        for line in names:
            console.print(f"pending: {escape(line)}")
        if not names:
            console.print("no backfill is pending")
        for line in scoped:
            console.print(f"scoped (not checked: passes are per scope): {escape(line)}")
    if names:
        raise typer.Exit(EXIT_FAILED)


def _all(
    session: _Session,
    url: str | None,
    apps: list[str] | None,
    write: bool,
    force: bool,
    as_json_output: bool,
) -> None:
    console = _console()

    async def act(d: JobDriver) -> list[dict[str, Any]]:
        outcomes: list[dict[str, Any]] = []
        declared = [b for b in registered_backfills() if not b.scoped]
        with Progress(
            TextColumn("backfills"),
            BarColumn(),
            MofNCompleteColumn(),
            console=console,
            disable=as_json_output or not console.is_terminal,
            transient=True,
        ) as progress:
            bar = progress.add_task("backfills", total=len(declared))
            for found in declared:
                try:
                    if write:
                        result = await found.enqueue(force=force)
                        outcomes.append({"name": found.name, "ok": True, **as_json(result)})
                    else:
                        plan = await found.plan(driver=d)
                        outcomes.append({"name": found.name, "ok": True, "plan": plan})
                except JobsError as exc:
                    # One wedged backfill must not block every later one.
                    outcomes.append(
                        {"name": found.name, "ok": False, "code": exc.code, "error": exc.message}
                    )
                progress.advance(bar)
        return outcomes

    outcomes = session.run(url, apps, "backfill --all failed", act)
    if as_json_output:
        _print_json([{**o, "plan": _plan_json(o["plan"])} if "plan" in o else o for o in outcomes])
    else:
        plans = [o["plan"] for o in outcomes if "plan" in o]
        if plans:
            console.print(_plan_table(plans))
        for o in outcomes:
            if not o["ok"]:
                console.print(
                    f"[red]failed[/] {escape(o['name'])}: {o['code']}: {escape(o['error'])}"
                )
            elif "id" in o:
                state = "live pass answered (deduped)" if o["deduped"] else "enqueued"
                console.print(f"{escape(o['name'])}: {state}, job {o['id']}")
        if not outcomes:
            console.print("no backfills declared (name the modules that declare them: --app)")
    if any(not o["ok"] for o in outcomes):
        raise typer.Exit(EXIT_FAILED)
