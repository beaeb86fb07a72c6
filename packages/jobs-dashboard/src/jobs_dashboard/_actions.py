"""The actions: every change the dashboard makes, one job at a time or in bulk (all POST).

Each POST passes three gates in this order: the auth guard (401, before any route), read-only
(403), and the CSRF token (403); a refused one changes nothing and is logged
``jobs.dashboard.refused``. A bulk action (a selection, everything matching the list's filter,
several queues or tasks) first answers a confirmation page that repeats the request; only the
confirmed POST acts. Every action that ran is logged ``jobs.dashboard.action`` with the actor,
the targets (ids or names), the filter and the counts.

Bulk over a filter uses the driver's bulk calls where introspection has one (retry, delete,
promote: 1,000 rows a call, called until nothing remains, at most :data:`MAX_BULK_CALLS` calls a
request). The others (cancel, retry from a step, resolve a step) walk the filtered listing by
its cursor and act on each row, at most :data:`MAX_WALK` rows a request; the result page then
says that more may remain.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from jobs_core import introspect
from jobs_core.driver import JobDriver
from jobs_core.errors import (
    DriverRequestInvalidError,
    DriverUnavailableError,
    JobsError,
    NotImplementedByDriverError,
)
from jobs_core.tenancy import Actor
from jobs_core.types import MAX_JOB_PAGE, BulkResult, JSONValue
from jobs_dashboard._app import Dashboard
from jobs_dashboard._query import ListQuery

_log = logging.getLogger("jobs.dashboard")

JOB_ACTIONS: Mapping[str, str] = {
    "retry": "requeued",
    "retry-from-step": "requeued",
    "cancel": "cancelled",
    "delete": "removed",
    "promote": "promoted",
    "resolve": "resolved",
}
"""Each job action and the past tense its notice and log use."""

QUEUE_ACTIONS: Mapping[str, str] = {"pause": "paused", "resume": "resumed"}
"""Each queue or task action and its past tense."""

MAX_BULK_CALLS = 100
"""The most driver bulk calls (1,000 rows each) one bulk request makes."""

MAX_WALK = 5_000
"""The most rows a bulk request that walks the listing acts on."""

MAX_FORM_BYTES = 256 * 1024
"""The largest form body accepted (a page of 200 selected ids is ~8 KiB)."""


@dataclass(frozen=True, slots=True)
class Params:
    """An action's own fields.

    Attributes:
        step: the step of ``retry-from-step`` and ``resolve``.
        ran: for ``resolve``: whether the step's effect happened.
        output: for ``resolve`` with ``ran``: its output (JSON form).
    """

    step: str | None = None
    ran: bool | None = None
    output: JSONValue = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a bulk action did.

    Attributes:
        affected: rows (or queues, tasks) changed.
        remaining: still matching and not changed; ``None`` when a walk stopped at its bound
            before the end of the listing.
        skipped: per error code, targets the action refused (e.g. ``X_JOB_NOT_REQUEUEABLE``).
    """

    affected: int
    remaining: int | None
    skipped: Mapping[str, int] = field(default_factory=dict)


class Form:
    """A parsed ``application/x-www-form-urlencoded`` body.

    Args:
        fields: every field's values, in order.
    """

    def __init__(self, fields: Mapping[str, list[str]]) -> None:
        self.fields = fields

    def get(self, name: str, default: str = "") -> str:
        """Answer a field's first value (``default`` when absent)."""
        values = self.fields.get(name)
        return values[0] if values else default

    def all(self, name: str) -> list[str]:
        """Answer every non-empty value of a field."""
        return [v for v in self.fields.get(name, []) if v]

    def first_values(self) -> dict[str, str]:
        """Answer each field's first value."""
        return {k: v[0] for k, v in self.fields.items() if v}


def _params(action: str, form: Form) -> Params:
    """Read an action's own fields.

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a missing step, a missing
            outcome, or an output that is not JSON.
    """
    if action not in ("retry-from-step", "resolve"):
        return Params()
    step = form.get("step").strip()
    if not step:
        raise DriverRequestInvalidError(f"{action} needs the step's name", field="step")
    if action == "retry-from-step":
        return Params(step=step)
    outcome = form.get("outcome")
    if outcome not in ("ran", "not-ran"):
        raise DriverRequestInvalidError(
            "resolve needs outcome 'ran' (with its output) or 'not-ran'", field="outcome"
        )
    output: JSONValue = None
    text = form.get("output").strip()
    if outcome == "ran" and text:
        try:
            output = json.loads(text)
        except ValueError as exc:
            raise DriverRequestInvalidError(
                f"output is not JSON (line {getattr(exc, 'lineno', '?')}, column "
                f'{getattr(exc, "colno", "?")}); write e.g. {{"id": "ch_1"}} or null',
                field="output",
            ) from None
    return Params(step=step, ran=outcome == "ran", output=output)


async def apply(driver: JobDriver, action: str, job_id: str, params: Params, actor: Actor) -> None:
    """Run one job action through :mod:`jobs_core.introspect`.

    Raises:
        JobsError: what the introspection call raises (``X_JOB_NOT_FOUND``,
            ``X_JOB_NOT_REQUEUEABLE``, ...).
    """
    if action == "retry":
        await introspect.requeue(driver, job_id)
    elif action == "retry-from-step":
        await introspect.requeue(driver, job_id, from_step=params.step)
    elif action == "cancel":
        await introspect.cancel(driver, job_id, f"cancelled from the dashboard by {actor.id}")
    elif action == "delete":
        await introspect.remove(driver, job_id)
    elif action == "promote":
        await introspect.promote(driver, job_id)
    else:
        assert params.step is not None and params.ran is not None
        await introspect.resolve_step(
            driver, job_id, params.step, ran=params.ran, output=params.output
        )


_MANY: Mapping[str, Callable[..., Awaitable[BulkResult]]] = {
    "retry": introspect.requeue_many,
    "delete": introspect.remove_many,
    "promote": introspect.promote_many,
}


async def by_filter(
    driver: JobDriver, action: str, query: ListQuery, params: Params, actor: Actor
) -> Outcome:
    """Act on every job matching ``query``'s filter (see the module docstring for the bounds)."""
    filt = query.job_query()
    many = _MANY.get(action)
    if many is not None:
        affected, remaining = 0, 0
        for _ in range(MAX_BULK_CALLS):
            result = await many(driver, **filt)
            affected += result.affected
            remaining = result.remaining
            if result.remaining == 0 or result.affected == 0:
                break
        return Outcome(affected, remaining)
    affected, walked = 0, 0
    skipped: Counter[str] = Counter()
    after: str | None = None
    while True:
        page = await introspect.list_jobs(driver, limit=MAX_JOB_PAGE, after=after, **filt)
        for row in page.rows:
            try:
                await apply(driver, action, str(row.id), params, actor)
                affected += 1
            except _WHOLE_REQUEST:
                raise
            except JobsError as exc:
                skipped[exc.code] += 1
        walked += len(page.rows)
        if page.next is None:
            return Outcome(affected, sum(skipped.values()), dict(skipped))
        if walked >= MAX_WALK:
            return Outcome(affected, None, dict(skipped))
        after = page.next


_WHOLE_REQUEST = (NotImplementedByDriverError, DriverUnavailableError)
"""Errors that concern the driver, not one target: they fail the whole request."""


async def on_each(targets: list[str], act: Callable[[str], Awaitable[None]]) -> Outcome:
    """Run ``act`` on each target; one refused is counted under its error code.

    Raises:
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED``, at the first target.
        DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``, where the backend went away.
    """
    affected = 0
    skipped: Counter[str] = Counter()
    for target in targets:
        try:
            await act(target)
            affected += 1
        except _WHOLE_REQUEST:
            raise
        except JobsError as exc:
            skipped[exc.code] += 1
    return Outcome(affected, sum(skipped.values()), dict(skipped))


def _logged(actor: Actor, action: str, scope: str, outcome: Outcome, **fields: Any) -> None:
    _log.info(
        "jobs.dashboard.action",
        extra={
            "event": "jobs.dashboard.action",
            "actor": actor.id,
            "action": action,
            "scope": scope,
            "affected": outcome.affected,
            "remaining": outcome.remaining,
            **{k: v for k, v in fields.items() if v},
        },
    )


class Actions:
    """The POST handlers of one dashboard.

    Args:
        dash: what the handlers share.
    """

    def __init__(self, dash: Dashboard) -> None:
        self.dash = dash

    async def _admit(self, request: Request) -> Form | Response:
        """Answer the parsed form, or the 403/413 refusal (read-only, CSRF, size)."""
        actor: Actor = request.state.actor
        if self.dash.read_only:
            return self._refuse(request, actor, "read-only", "this dashboard is read-only", 403)
        body = await request.body()
        if len(body) > MAX_FORM_BYTES:
            return self._refuse(request, actor, "too-large", "form too large", 413)
        form = Form(parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True))
        if not self.dash.csrf.valid(request, form.first_values(), actor):
            reason = "CSRF token missing or wrong: reload the page and try again"
            return self._refuse(request, actor, "csrf", reason, 403)
        return form

    @staticmethod
    def _refuse(request: Request, actor: Actor, why: str, text: str, status: int) -> Response:
        _log.warning(
            "jobs.dashboard.refused",
            extra={
                "event": "jobs.dashboard.refused",
                "actor": actor.id,
                "reason": why,
                "path": request.url.path,
            },
        )
        return PlainTextResponse(text, status)

    def _redirect(self, request: Request, path: str, done: str) -> Response:
        return RedirectResponse(f"{request.state.base}{path}?done={done}", 303)

    def _confirm(self, request: Request, form: Form, summary: str, back: str) -> Response:
        fields = [
            (name, value)
            for name, values in form.fields.items()
            if name not in ("csrf", "confirmed")
            for value in values
        ]
        return self.dash.render(
            request, "confirm.html", summary=summary, fields=fields, back=back, page="jobs"
        )

    async def job(self, request: Request) -> Response:
        """One job action (``/jobs/{id}/{action}``); answers a redirect to the job's page."""
        admitted = await self._admit(request)
        if isinstance(admitted, Response):
            return admitted
        action = request.path_params["action"]
        job_id = request.path_params["job_id"]
        actor: Actor = request.state.actor
        if action not in JOB_ACTIONS:
            return PlainTextResponse(f"unknown action {action!r}", 404)
        try:
            params = _params(action, admitted)
            await apply(self.dash.driver, action, job_id, params, actor)
        except JobsError as exc:
            return self.dash.failure(request, exc)
        _logged(actor, action, "one", Outcome(1, 0), targets=[job_id], step=params.step)
        if action == "delete":
            return self._redirect(request, "/jobs", "removed")
        return self._redirect(request, f"/jobs/{job_id}", JOB_ACTIONS[action])

    async def bulk(self, request: Request) -> Response:
        """A job action on a selection of ids or on everything matching a filter."""
        admitted = await self._admit(request)
        if isinstance(admitted, Response):
            return admitted
        form = admitted
        actor: Actor = request.state.actor
        action = form.get("action")
        scope = form.get("scope")
        dead = form.get("back") == "dead"
        if action not in JOB_ACTIONS or scope not in ("selection", "filter"):
            return PlainTextResponse("unknown bulk action or scope", 400)
        ids = form.all("id")[:MAX_JOB_PAGE]
        try:
            query = ListQuery.parse(form.first_values(), **({"state": "dead"} if dead else {}))
            params = _params(action, form)
            query.job_query()
        except JobsError as exc:
            return self.dash.failure(request, exc)
        back = query.href(f"{request.state.base}{'/dead' if dead else '/jobs'}")
        label = action.replace("-", " ")
        if scope == "selection" and not ids:
            return self.dash.failure(
                request,
                DriverRequestInvalidError("no job is selected: tick some rows first", field="id"),
            )
        if form.get("confirmed") != "yes":
            if scope == "selection":
                summary = f"{label.capitalize()} the {len(ids)} selected job(s)?"
            else:
                shown = ", ".join(f"{k}={v}" for k, v in query.fields.items()) or "no filter"
                summary = f"{label.capitalize()} every job matching {shown}?"
            return self._confirm(request, form, summary, back)
        driver = self.dash.driver
        try:
            if scope == "selection":
                outcome = await on_each(ids, lambda i: apply(driver, action, i, params, actor))
            else:
                outcome = await by_filter(driver, action, query, params, actor)
        except JobsError as exc:
            return self.dash.failure(request, exc)
        _logged(
            actor,
            action,
            scope,
            outcome,
            targets=ids if scope == "selection" else None,
            filter=dict(query.fields) if scope == "filter" else None,
            step=params.step,
        )
        return self.dash.render(
            request,
            "result.html",
            verb=JOB_ACTIONS[action],
            outcome=outcome,
            back=back,
            page="dead" if dead else "jobs",
        )

    async def queues(self, request: Request) -> Response:
        """Pause or resume one queue, the selected queues, or every queue."""

        async def every(driver: JobDriver) -> list[str]:
            return [q.stats.queue for q in await introspect.stats(driver)]

        pause, resume = introspect.pause_queue, introspect.resume_queue
        return await self._names(request, "queue", every, pause, resume, "/")

    async def tasks(self, request: Request) -> Response:
        """Pause or resume one task, the selected tasks, or every task."""
        from jobs_core.task import TASK_REGISTRY

        async def every(driver: JobDriver) -> list[str]:
            declared = {t.name for t in (self.dash.task_registry or TASK_REGISTRY).all()}
            return sorted(declared | {t.task for t in await introspect.tasks(driver)})

        pause, resume = introspect.pause_task, introspect.resume_task
        return await self._names(request, "task", every, pause, resume, "/tasks")

    async def _names(
        self,
        request: Request,
        kind: str,
        every: Callable[[JobDriver], Awaitable[list[str]]],
        pause: Callable[[JobDriver, str], Awaitable[None]],
        resume: Callable[[JobDriver, str], Awaitable[None]],
        path: str,
    ) -> Response:
        admitted = await self._admit(request)
        if isinstance(admitted, Response):
            return admitted
        form = admitted
        actor: Actor = request.state.actor
        action = request.path_params["action"]
        if action not in QUEUE_ACTIONS:
            return PlainTextResponse(f"unknown action {action!r}", 404)
        act = pause if action == "pause" else resume
        driver = self.dash.driver
        scope = "all" if form.get("scope") == "all" else "selection"
        try:
            names = await every(driver) if scope == "all" else form.all(kind)
            if not names:
                raise DriverRequestInvalidError(f"no {kind} is selected", field=kind)
            back = f"{request.state.base}{path}"
            if (scope == "all" or len(names) > 1) and form.get("confirmed") != "yes":
                summary = f"{action.capitalize()} {len(names)} {kind}s: {', '.join(names)}?"
                return self._confirm(request, form, summary, back)
            outcome = await on_each(names, lambda name: act(driver, name))
        except JobsError as exc:
            return self.dash.failure(request, exc)
        _logged(actor, f"{action}-{kind}", scope, outcome, targets=names)
        if len(names) == 1 and scope == "selection" and outcome.affected == 1:
            return self._redirect(request, path, QUEUE_ACTIONS[action])
        page = "overview" if kind == "queue" else "tasks"
        return self.dash.render(
            request,
            "result.html",
            verb=QUEUE_ACTIONS[action],
            outcome=outcome,
            back=back,
            page=page,
        )
