"""The pages: overview, jobs list, dead letters, one job, workers and cron tasks (all GET).

Each page reads through :mod:`jobs_core.introspect` and checks the capability it needs with
:meth:`~jobs_dashboard._app.Dashboard.carries` first, so a driver without it gets a page saying
what is missing rather than an error. Every page is also its own live fragment: the browser's
script fetches the same URL again and swaps the parts marked ``data-live``.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from jobs_core import introspect
from jobs_core.errors import JobsError
from jobs_core.job import JobRegistry
from jobs_core.steps import COMPENSATE_PREFIX, UNWINDING
from jobs_core.task import TASK_REGISTRY, next_task_run
from jobs_core.types import (
    LIVE_STATES,
    REQUEUEABLE_STATES,
    CounterBucket,
    JobInfo,
    JobState,
    StepRecord,
)
from jobs_dashboard._app import Dashboard
from jobs_dashboard._query import ListQuery

CHART_MINUTES = 60
"""How many minutes of counters the overview charts."""

CHART_NAMES = 50
"""The most job names whose counters the chart reads (the busiest first)."""

NOTICES = {
    "requeued": "Requeued: the job is ready again.",
    "cancelled": "Cancelled.",
    "removed": "Deleted, with its steps.",
    "promoted": "Promoted: the job is due now.",
    "resolved": "Step resolved; retry the job to let the run go on.",
    "paused": "Paused.",
    "resumed": "Resumed.",
}
"""What a page says after a redirect from an action (``?done=<key>``); nothing else is shown."""


@dataclasses.dataclass(frozen=True, slots=True)
class Chart:
    """Outcomes per minute over the last :data:`CHART_MINUTES`, summed over job names.

    Attributes:
        minutes: each minute's first instant (UTC), oldest first.
        done: rows settled ``done`` per minute (throughput).
        failures: attempts retried plus rows settled ``failed`` or ``dead`` per minute.
        peak: the largest value of either series (at least 1, the chart's scale).
        totals: per job name, the sums over the window, busiest first.
    """

    minutes: tuple[datetime, ...]
    done: tuple[int, ...]
    failures: tuple[int, ...]
    peak: int
    totals: tuple[CounterBucket, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class StepRow:
    """One step as the job page shows it.

    Attributes:
        record: the stored record (outputs redacted).
        compensated: a compensator of this step ran (``compensate:<name>`` exists).
        compensates: for a compensator, the step it undid.
        unknown: a ``once`` step that started and whose completion was never recorded, on a
            row no worker holds: its outcome needs an operator.
    """

    record: StepRecord
    compensated: bool
    compensates: str | None
    unknown: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Moment:
    """One entry of a job's timeline.

    Attributes:
        at: when (UTC).
        what: a short label.
        detail: more text, or ``""``.
    """

    at: datetime
    what: str
    detail: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class TaskRow:
    """One cron task: its declaration (if this process has it) and its stored state.

    Attributes:
        name: the task name.
        cron: its cron expression, or ``None`` when undeclared here.
        tz: its zone, or ``None``.
        catch_up: its catch-up policy, or ``None``.
        next_fire: its next occurrence after now (UTC), or ``None``.
        state: what the scheduler state holds, or ``None`` when it holds nothing yet.
    """

    name: str
    cron: str | None
    tz: str | None
    catch_up: str | None
    next_fire: datetime | None
    state: introspect.TaskOverview | None


def step_rows(job: JobInfo) -> list[StepRow]:
    """Answer the job's steps in ``seq`` order, marked as the job page shows them."""
    names = {step.name for step in job.steps}
    held = job.state == JobState.RUNNING
    rows = []
    for step in sorted(job.steps, key=lambda s: s.seq):
        undone = (
            step.name[len(COMPENSATE_PREFIX) :] if step.name.startswith(COMPENSATE_PREFIX) else None
        )
        rows.append(
            StepRow(
                record=step,
                compensated=f"{COMPENSATE_PREFIX}{step.name}" in names,
                compensates=undone,
                unknown=step.once and step.status == "started" and not held,
            )
        )
    return rows


def timeline(job: JobInfo) -> list[Moment]:
    """Answer what is known of a job's life, oldest first.

    Rows keep their attempt count, not a record per attempt, so the timeline is built from the
    row's instants and its steps' instants: enqueued, each step started and ended, the unwind,
    and the row's last change with its state and last error.
    """
    moments = [
        Moment(job.created_at, "enqueued", f"by {job.enqueued_by}" if job.enqueued_by else "")
    ]
    for step in job.steps:
        if step.name == UNWINDING and step.started_at is not None:
            moments.append(
                Moment(step.started_at, "unwind began", "compensating, last in first out")
            )
            continue
        if step.started_at is not None:
            moments.append(Moment(step.started_at, f"step {step.name} started"))
        if step.completed_at is not None:
            moments.append(Moment(step.completed_at, f"step {step.name} {step.status}"))
        if step.status == "waiting" and step.wake_at is not None:
            moments.append(Moment(step.wake_at, f"step {step.name} wakes", step.event or ""))
    last = f"attempt {job.attempt} of {job.max_attempts}"
    if job.last_error_code or job.last_error:
        last += f"; {job.last_error_code or ''} {(job.last_error or '')[:200]}".rstrip()
    moments.append(Moment(job.updated_at, f"now {job.state.value}", last))
    if job.state in (JobState.DELAYED, JobState.SUSPENDED, JobState.READY):
        moments.append(Moment(job.run_at, "due", "runs at or after this instant"))
    return sorted(moments, key=lambda m: m.at)


class Pages:
    """The GET handlers of one dashboard.

    Args:
        dash: what the pages share.
    """

    def __init__(self, dash: Dashboard) -> None:
        self.dash = dash

    @property
    def _registry(self) -> JobRegistry | None:
        return self.dash.registry

    def _notice(self, request: Request) -> str | None:
        return NOTICES.get(request.query_params.get("done", ""))

    async def overview(self, request: Request) -> Response:
        """Per queue: counts, oldest due age, demand, paused; the outcomes chart."""
        dash = self.dash
        try:
            queues = await introspect.stats(dash.driver)
            chart = await self._chart() if dash.carries("counters") else None
        except JobsError as exc:
            return dash.failure(request, exc)
        return dash.render(
            request,
            "overview.html",
            queues=queues,
            chart=chart,
            notice=self._notice(request),
            page="overview",
        )

    async def _chart(self) -> Chart:
        now = self.dash.clock.now()
        first = (now - timedelta(minutes=CHART_MINUTES - 1)).replace(second=0, microsecond=0)
        totals = await introspect.counter_totals(self.dash.driver, since=first)
        busiest = sorted(
            totals.values(), key=lambda b: (-(b.done + b.retried + b.failed + b.dead), b.name)
        )
        done: dict[datetime, int] = defaultdict(int)
        failures: dict[datetime, int] = defaultdict(int)
        for total in busiest[:CHART_NAMES]:
            for bucket in await introspect.counters(self.dash.driver, total.name, since=first):
                if bucket.tier == "1m":
                    done[bucket.bucket] += bucket.done
                    failures[bucket.bucket] += bucket.retried + bucket.failed + bucket.dead
        minutes = tuple(first + timedelta(minutes=i) for i in range(CHART_MINUTES))
        done_series = tuple(done.get(m, 0) for m in minutes)
        failure_series = tuple(failures.get(m, 0) for m in minutes)
        return Chart(
            minutes=minutes,
            done=done_series,
            failures=failure_series,
            peak=max(1, *done_series, *failure_series),
            totals=tuple(busiest),
        )

    async def jobs(self, request: Request) -> Response:
        """One page of jobs under the URL's filter, with cursors both ways."""
        return await self._list(request, dead=False)

    async def dead(self, request: Request) -> Response:
        """The dead-letter queue: the jobs list fixed to ``state=dead``."""
        return await self._list(request, dead=True)

    async def _list(self, request: Request, *, dead: bool) -> Response:
        dash = self.dash
        context: dict[str, Any] = {
            "dead": dead,
            "page": "dead" if dead else "jobs",
            "notice": self._notice(request),
        }
        if not dash.carries("introspect"):
            return dash.render(
                request,
                "jobs.html",
                query=ListQuery(),
                rows=None,
                missing=dash.missing("introspect"),
                **context,
            )
        fixed = {"state": JobState.DEAD.value} if dead else {}
        try:
            query = ListQuery.parse(request.query_params, **fixed)
            # One URL per listing: a filter form's empty fields (and the fixed state of the
            # dead-letter page) are dropped, so the address bar is the shareable link.
            path = "/dead" if dead else "/jobs"
            shown = dataclasses.replace(
                query, fields={k: v for k, v in query.fields.items() if k not in fixed}
            )
            canonical = shown.href("", after=query.after, before=query.before).lstrip("?")
            if request.url.query != canonical:
                target = f"{request.state.base}{path}" + (f"?{canonical}" if canonical else "")
                return RedirectResponse(target, 302)
            page = await introspect.list_jobs(
                dash.driver,
                limit=query.limit,
                after=query.after,
                before=query.before,
                registry=self._registry,
                redact_keys=dash.redact_keys,
                **query.job_query(),
            )
        except JobsError as exc:
            shown = ListQuery.parse({}, **fixed)
            return dash.render(
                request,
                "jobs.html",
                400,
                query=shown,
                rows=None,
                error=exc,
                missing=None,
                **context,
            )
        return dash.render(
            request,
            "jobs.html",
            query=shown,
            rows=page.rows,
            next=page.next,
            prev=page.prev,
            missing=None,
            **context,
        )

    async def job(self, request: Request) -> Response:
        """One job: fields, actions, progress, error and stack, timeline, steps, input."""
        dash = self.dash
        if not dash.carries("introspect"):
            return dash.render(
                request, "job.html", view=None, missing=dash.missing("introspect"), page="jobs"
            )
        try:
            view = await introspect.get_job(
                dash.driver,
                request.path_params["job_id"],
                registry=self._registry,
                redact_keys=dash.redact_keys,
            )
        except JobsError as exc:
            return dash.failure(request, exc)
        job = view.job
        return dash.render(
            request,
            "job.html",
            view=view,
            job=job,
            steps=step_rows(job),
            moments=timeline(job),
            can_retry=job.state in REQUEUEABLE_STATES,
            can_cancel=job.state in LIVE_STATES,
            can_delete=job.state != JobState.RUNNING,
            can_promote=job.state in (JobState.DELAYED, JobState.SUSPENDED),
            notice=self._notice(request),
            missing=None,
            page="jobs",
        )

    async def workers(self, request: Request) -> Response:
        """Live workers: host, queues, slots, in flight, heartbeat age, draining."""
        dash = self.dash
        if not dash.carries("workers"):
            return dash.render(
                request,
                "workers.html",
                workers=None,
                missing=dash.missing("workers"),
                page="workers",
            )
        try:
            found = await introspect.workers(dash.driver)
        except JobsError as exc:
            return dash.failure(request, exc)
        return dash.render(
            request,
            "workers.html",
            workers=found,
            now=dash.clock.now(),
            missing=None,
            page="workers",
        )

    async def tasks(self, request: Request) -> Response:
        """Cron tasks: schedule, zone, next fire, last fire, watermark, paused."""
        dash = self.dash
        declared = {t.name: t for t in (dash.task_registry or TASK_REGISTRY).all()}
        stored: dict[str, introspect.TaskOverview] = {}
        missing = None
        if dash.carries("scheduler_state"):
            try:
                stored = {t.task: t for t in await introspect.tasks(dash.driver)}
            except JobsError as exc:
                return dash.failure(request, exc)
        else:
            missing = dash.missing("scheduler_state")
        now = dash.clock.now()
        rows = []
        for name in sorted(set(declared) | set(stored)):
            handle = declared.get(name)
            rows.append(
                TaskRow(
                    name=name,
                    cron=handle.cron if handle else None,
                    tz=handle.tz if handle else None,
                    catch_up=handle.catch_up if handle else None,
                    next_fire=next_task_run(handle, now) if handle else None,
                    state=stored.get(name),
                )
            )
        return dash.render(
            request,
            "tasks.html",
            tasks=rows,
            missing=missing,
            notice=self._notice(request),
            page="tasks",
        )
