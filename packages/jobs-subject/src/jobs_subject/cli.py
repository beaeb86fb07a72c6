"""The ``jobsctl subject`` command group: ``plan NAME`` prints what an erase or export would do.

Registered through the ``jobs.cli`` entry point: :func:`register` adds a ``subject`` sub-app.
``jobsctl subject plan NAME --app MODULE [--driver URL] [--json]`` imports the modules that
declare subjects, reads the catalog and prints the plan (tables children first, treatments, the
key path that reaches each table, the loop-closing keys cleared first), touching no row. A
refusal prints its code and fix and exits 2, as a run would refuse.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from jobs_core import install_driver, open_driver
from jobs_core.errors import JobsError
from jobs_subject._catalog import key_path
from jobs_subject._plan import Plan
from jobs_subject._subject import SUBJECTS, Subject

EXIT_USAGE = 2

_stderr = Console(stderr=True, highlight=False)


def _exit(code: str | None, message: str, fix: str | None = None) -> typer.Exit:
    _stderr.print(f"[bold red]error[/] {escape(code or '')}: {escape(message)}", soft_wrap=True)
    if fix:
        _stderr.print(f"[bold]fix:[/] {escape(fix)}", soft_wrap=True)
    return typer.Exit(EXIT_USAGE)


def _import(apps: list[str]) -> None:
    """Import every APP module, the current directory first on ``sys.path``."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for app in apps:
        try:
            importlib.import_module(app)
        except Exception as exc:
            raise _exit(None, f"importing APP {app!r} failed: {type(exc).__name__}: {exc}") from exc


def describe(subject: Subject, plan: Plan) -> dict[str, Any]:
    """Answer the plan's JSON with the subject's name and targets."""
    return {
        "name": subject.name,
        **plan.describe(),
        "targets": [
            {"target": target.name, **treatment.describe()} for target, treatment in subject.targets
        ],
    }


def _show(subject: Subject, plan: Plan) -> None:
    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 200
    console.print(
        f"subject [bold]{escape(subject.name)}[/]: {escape(plan.subject.name.shown(plan.home))} "
        f"({', '.join(plan.key)}) in schema {escape(plan.home)}, {len(plan.tables)} tables, "
        "children first"
    )
    if plan.clears:
        console.print(
            "first, loop-closing keys cleared (set to NULL where they point at the subject):"
        )
        for clear in plan.clears:
            console.print(
                f"  {escape(clear.child.name.shown(plan.home))}.{escape(', '.join(clear.columns))}"
                f" ({escape(clear.key.name)}): {escape(key_path(clear.path, plan.home))}"
            )
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("#", "TABLE", "TREATMENT", "REACHED BY"):
        table.add_column(column)
    for number, planned in enumerate(plan.tables, 1):
        treatment = planned.treatment
        shown: str = treatment.kind
        if treatment.kind == "retain":
            shown += f" ({treatment.reason})"
        if treatment.kind == "anonymize":
            shown += f" ({', '.join(sorted(treatment.values))})"
        path = key_path(planned.path, plan.home) or "the subject's own row, last"
        table.add_row(str(number), escape(planned.shown), escape(shown), escape(path))
    console.print(table)
    for target, treatment in subject.targets:
        console.print(f"target {escape(target.name)}: {treatment.kind}")


def plan(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The subject's name.")],
    apps: Annotated[
        list[str] | None,
        typer.Option(
            "--app", help="A module that declares the subject (repeatable).", show_default=False
        ),
    ] = None,
    driver: Annotated[
        str | None,
        typer.Option(
            "--driver",
            envvar="JOBS_DRIVER",
            help="The PostgreSQL URL, when the subject names no driver of its own.",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
) -> None:
    """Print the plan of subject NAME (tables, order, treatments, key paths); no row is touched."""
    _import(apps or [])
    subject = SUBJECTS.get(name)
    if subject is None:
        known = ", ".join(sorted(SUBJECTS)) or "none"
        raise _exit(
            None,
            f"no subject named {name!r} (declared: {known})",
            "name the module that calls define_subject(...) with --app",
        )
    if subject.driver is None and not driver:
        raise _exit(None, "the subject names no driver", "pass --driver postgresql://...")

    async def read() -> Plan:
        opened = open_driver(driver) if subject.driver is None and driver else None
        install_driver(opened)
        try:
            return await subject.plan()
        finally:
            install_driver(None)
            if opened is not None:
                await opened.close()

    try:
        planned = asyncio.run(read())
    except JobsError as exc:
        raise _exit(exc.code, exc.message, exc.fix) from None
    if as_json:
        typer.echo(json.dumps(describe(subject, planned), indent=2))
    else:
        _show(subject, planned)


def register(app: typer.Typer) -> None:
    """Add the ``subject`` command group to ``jobsctl`` (the ``jobs.cli`` entry point)."""
    group = typer.Typer(
        name="subject",
        help="One person's data: the plan an export or erase follows.",
        no_args_is_help=True,
    )
    group.command("plan")(plan)
    app.add_typer(group, name="subject")


__all__ = ["describe", "plan", "register"]
