"""``refresh_view()``: refresh one materialized view, as a job the app's ``task`` schedules.

At its first pass in a process the view is checked (``view_check``): it must be a materialized
view, and ``concurrently=True`` needs a plain unique index on it (no ``WHERE``, no expressions),
which ``REFRESH MATERIALIZED VIEW CONCURRENTLY`` requires to tell old rows from new ones. A
refusal is ``X_JOB_REFRESH_VIEW_INVALID`` (terminal: retrying cannot create the view). The
refresh runs on an autocommit connection: ``CONCURRENTLY`` refuses to run in a transaction block.
"""

from __future__ import annotations

from typing import Any, Literal

from psycopg import sql
from pydantic import BaseModel, ConfigDict

from jobs_core import JobContext, JobHandle, JobRegistry, Retry, Step
from jobs_core.errors import RefreshViewInvalidError
from jobs_core.factories._shared import declare_singleton
from jobs_core.factories.keyset import Connect, connect_problem, open_connection
from jobs_core.job import declaration_site
from jobs_pg._sql import blocks

__all__ = ["RefreshViewJob", "refresh_view"]

_VIEW_CHECK = blocks()["view_check"].encode()


class RefreshRun(BaseModel):
    """A refresh takes no input (``{}``)."""

    model_config = ConfigDict(extra="forbid")


class RefreshViewJob(JobHandle[Any, Any]):
    """A declared view refresh: an ordinary job handle (built by :func:`refresh_view`)."""

    view: str
    concurrently: bool
    checked: bool

    def describe(self) -> dict[str, Any]:
        """Answer the job's descriptor with the view and the refresh's mode."""
        return {
            **super().describe(),
            "factory": "refresh_view",
            "view": self.view,
            "concurrently": self.concurrently,
        }


def refresh_view(
    *,
    name: str,
    view: str,
    connect: Connect,
    concurrently: bool = False,
    tenant: Literal["none"] = "none",
    queue: str = "default",
    retry: Retry | None = None,
    registry: JobRegistry | None = None,
) -> RefreshViewJob:
    """Declare a job that refreshes the materialized view ``view``.

    Args:
        name: the durable name.
        view: the materialized view (``name`` or ``schema.name``).
        connect: the app's database (see :data:`jobs_core.factories.keyset.Connect`).
        concurrently: refresh without blocking readers (needs a unique index on the view).
        tenant: ``"none"``: a view spans tenants.
        queue: the queue refreshes run on.
        retry: attempts and backoff (the core's default).
        registry: the job registry to join (default the process-wide one).

    Raises:
        RefreshViewInvalidError: ``X_JOB_REFRESH_VIEW_INVALID`` naming every bad field here; at
            the first pass, for a view that does not exist or (with ``concurrently``) has no
            unique index.
        JobDuplicateError: ``X_JOB_DUPLICATE`` when another declaration holds ``name``.
    """
    site = declaration_site()
    problems = []
    parts = view.split(".") if isinstance(view, str) else []
    if not parts or len(parts) > 2 or not all(parts) or "\x00" in str(view):
        problems.append(f"view: a view name or schema.name, got {view!r}")
    wrong = connect_problem(connect)
    if wrong is not None:
        problems.append(wrong)
    if not isinstance(concurrently, bool):
        problems.append(f"concurrently: True or False, got {concurrently!r}")
    if tenant != "none":
        problems.append('tenant: a view spans tenants, tenant="none"')
    if problems:
        raise RefreshViewInvalidError(
            f"refresh_view {name!r} is declared wrong: " + "; ".join(problems),
            job=name,
            problems=problems,
        )

    async def check(conn: Any) -> None:
        cur = await conn.execute(_VIEW_CHECK, {"view": view})
        exists, unique = await cur.fetchone() or (False, False)
        if not exists:
            raise RefreshViewInvalidError(
                f"view: {view!r} is not a materialized view in this database; create it first",
                view=view,
            )
        if concurrently and not unique:
            raise RefreshViewInvalidError(
                f"concurrently: {view!r} has no unique index (no WHERE, no expressions), which "
                "REFRESH MATERIALIZED VIEW CONCURRENTLY needs; create one or pass "
                "concurrently=False",
                view=view,
            )

    async def refresh() -> str:
        statement = sql.SQL("REFRESH MATERIALIZED VIEW {}{}").format(
            sql.SQL("CONCURRENTLY ") if concurrently else sql.SQL(""),
            sql.Identifier(*view.split(".")),
        )
        async with open_connection(connect) as conn:
            if not made.checked:
                await check(conn)
                made.checked = True
            was = conn.autocommit
            if not was:
                await conn.rollback()
                await conn.set_autocommit(True)
            try:
                await conn.execute(statement)
            finally:
                if not was:
                    await conn.set_autocommit(False)
        return view

    async def run(_run: RefreshRun, step: Step, ctx: JobContext) -> dict[str, Any]:
        await step.run("refresh", refresh)
        return {"view": view, "concurrently": concurrently}

    made = declare_singleton(
        RefreshViewJob,
        run,
        name=name,
        input=RefreshRun,
        key=f"refresh_view:{name}",
        site=site,
        queue=queue,
        retry=retry,
        registry=registry,
    )
    made.view = view
    made.concurrently = concurrently
    made.checked = False
    return made
