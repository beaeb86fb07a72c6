"""``jobsctl enqueue``: queue one run of a declared job from a shell (Celery's ``call``).

The job's declaration comes from ``--app`` modules, so the input is validated, keyed and
tenanted exactly as ``handle.enqueue`` does in the app; the command answers the ids. It always
queues directly on ``--driver``: an app's installed outbox stages on the app's own transactions,
and a shell has none (``outbox=False``).
"""

from __future__ import annotations

import difflib
import json
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from jobs_core._cli_operator import DriverOption, JsonOption, _console, _print_json
from jobs_core._cli_operator import _Session as Session
from jobs_core.driver import JobDriver
from jobs_core.errors import JobOptionsInvalidError, JobUnknownError
from jobs_core.job import REGISTRY
from jobs_core.types import EnqueueResult

DeclaringApps = Annotated[
    list[str] | None,
    typer.Option(
        "--app",
        help="The module that declares job NAME (repeatable; the current directory first).",
        show_default=False,
    ),
]


def _input_value(text: str) -> Any:
    """Answer ``--input`` as a JSON value: the text itself, or ``@path``'s contents."""
    source = text
    if text.startswith("@"):
        try:
            source = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise typer.BadParameter(f"cannot read {text[1:]}: {exc.strerror}") from None
    try:
        return json.loads(source)
    except ValueError as exc:
        raise typer.BadParameter(f"not JSON ({exc})", param_hint="--input") from None


def _instant(text: str | None) -> datetime | None:
    """Answer ``--run-at`` as an aware instant (ISO 8601 with an offset or Z)."""
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not ISO 8601 (e.g. 2026-12-01T09:00:00+01:00)", param_hint="--run-at"
        ) from None
    if when.tzinfo is None:
        raise typer.BadParameter(
            f"{text!r} names no offset; add one (+01:00) or Z for UTC", param_hint="--run-at"
        )
    return when


def add_enqueue_command(app: typer.Typer, *, driver: JobDriver | None = None) -> None:
    """Add ``enqueue`` to ``app``.

    Args:
        app: the ``jobsctl`` typer app.
        driver: a driver to use instead of opening ``--driver`` (never closed here).
    """
    session = Session(driver)

    @app.command("enqueue")
    def enqueue(
        name: Annotated[
            str, typer.Argument(metavar="NAME", help="The job's name (jobsctl manifest APP).")
        ],
        input_text: Annotated[
            str,
            typer.Option(
                "--input",
                help="The input as JSON, or @FILE to read it from a file.",
                show_default=False,
            ),
        ],
        delay: Annotated[
            str | None,
            typer.Option(
                "--delay",
                help="Run no earlier than this from now (5s, 10m, 3d).",
                show_default=False,
            ),
        ] = None,
        run_at: Annotated[
            str | None,
            typer.Option(
                "--run-at",
                help="Run no earlier than this instant (ISO 8601 with an offset).",
                show_default=False,
            ),
        ] = None,
        queue: Annotated[
            str | None,
            typer.Option(
                "--queue", help="Another queue than the declared one.", show_default=False
            ),
        ] = None,
        tenant: Annotated[
            str | None,
            typer.Option(
                "--tenant",
                help="State the tenant (it must be the one the input names).",
                show_default=False,
            ),
        ] = None,
        as_json_output: JsonOption = False,
        driver_url: DriverOption = None,
        apps: DeclaringApps = None,
    ) -> None:
        """Queue one run of job NAME, declared in --app, and print its ids.

        The input is validated, keyed and tenanted as the app's own enqueue does; a live job
        with the same key is answered instead (deduped).
        """
        value = _input_value(input_text)
        when = _instant(run_at)

        async def act(opened: JobDriver) -> EnqueueResult:
            handle = REGISTRY.get(name)
            if handle is None:
                raise JobUnknownError(_unknown_job_text(name), job=name)
            if delay is not None and when is not None:
                raise JobOptionsInvalidError("--delay and --run-at are exclusive", option="delay")
            return await handle.enqueue(
                value, delay=delay, run_at=when, queue=queue, tenant_id=tenant, outbox=False
            )

        result = session.run(driver_url, apps, "cannot enqueue the job", act)
        if as_json_output:
            _print_json({"name": name, **_fields(result)})
            return
        note = " (deduped: a live job holds its key)" if result.deduped else ""
        _console().print(f"enqueued {result.id} ({name}), run {result.run_id}{note}")


def _unknown_job_text(name: str) -> str:
    """Say why ``name`` is not declared: no --app at all, a near miss, or the names there are."""
    declared = sorted(h.name for h in REGISTRY.all())
    if not declared:
        return (
            f"no job named {name!r} is declared: no --app module declares any job; pass "
            "--app MODULE for the module that declares it"
        )
    near = difflib.get_close_matches(name, declared, n=3)
    if near:
        hint = "did you mean " + " or ".join(repr(n) for n in near) + "?"
    else:
        hint = f"declared: {', '.join(declared)}"
    return (
        f"no job named {name!r} is declared by the --app modules ({hint}); pass --app MODULE "
        "for the module that declares it"
    )


def _fields(result: EnqueueResult) -> dict[str, Any]:
    return {"id": str(result.id), "run_id": str(result.run_id), "deduped": result.deduped}
