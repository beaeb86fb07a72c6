"""The export: ``subject_export()``, everything of one subject to an ``ExportSink``.

A run plans from the catalog (the same plan, and the same refusals, as an erase), then writes
one object per page per table and per target: the subject's own row, then each planned table
parents first, a page of parent keys per step (``export:<table>:<key>:<page>``), and each target
a page per step (``export-target:<name>:<page>``), handed the subject's row read fresh in that
step. ``RETAIN`` tables are exported like any other (the person may see what is kept and why).
Parts are ``<prefix>/tables/<table>/part-NNNNN.<ext>`` and ``<prefix>/targets/<name>/part-...``,
numbered by the parts written before them (a page that selects no row writes none), so a page
run twice after a kill rewrites its own part. ``<prefix>/index.json`` is written last, in a step
of its own: while it is missing the export is not complete, and when it exists it lists every
part, its rows and its bytes.

Columns a table's ``columns=`` leaves out (sealed: password hashes, tokens) are never read.
Instants are ISO 8601 UTC (:mod:`._values`). Step outputs hold cursors and counts, never rows.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, TypedDict
from urllib.parse import quote

from jobs_core import JobContext, JobHandle, JobRegistry, Retry, Settled, Step
from jobs_core.errors import ExportRowInvalidError
from jobs_core.limits import Concurrency
from jobs_import_export import ExportSink, check_key, encode_records
from jobs_subject._declare import call, caller_site, check_subject, declare, key_reader
from jobs_subject._erase import step_name, subject_row
from jobs_subject._plan import Plan, PlannedTable
from jobs_subject._select import Statements
from jobs_subject._sql import block
from jobs_subject._subject import Subject
from jobs_subject._target import SubjectTarget
from jobs_subject._values import exported

Format = Literal["csv", "ndjson"]


class ExportRecord(TypedDict):
    """The result of an export run (the job's ``result``).

    Attributes:
        index: the key of ``index.json``.
        parts: objects written (the index excluded).
        rows: rows written across them.
        bytes: bytes written across them.
    """

    index: str
    parts: int
    rows: int
    bytes: int


def _segment(name: str) -> str:
    """A table or target name as one key segment (a ``/`` or control character escaped)."""
    return quote(name, safe=" .-_@+=,;~!$&'()*")


def _listed(out: dict[str, Any]) -> dict[str, Any]:
    """A written part as the index lists it."""
    return {"key": out["part"], "rows": out["rows"], "bytes": out["bytes"]}


async def _paged(
    step: Step,
    name: tuple[str, ...],
    parts: list[dict[str, Any]],
    page: Callable[..., Awaitable[dict[str, Any]]],
    *args: Any,
) -> None:
    """Run ``page(cursor, part_number, *args)`` as steps ``<name>:0``, ``:1``, ... to the end.

    Each part a page wrote is added to ``parts``, so part numbers go on from the parts before.
    """
    cursor: Any = None
    number = 0
    while True:
        out = await step.run(step_name(*name, str(number)), page, cursor, len(parts), *args)
        number += 1
        if out["part"] is not None:
            parts.append(_listed(out))
        if out["cursor"] is None:
            return
        cursor = out["cursor"]


class _Export:
    """One ``subject_export`` declaration's settings and the code its body runs."""

    def __init__(
        self,
        subject: Subject,
        key: Callable[[Any], Any],
        sink: Callable[[], ExportSink],
        prefix: Callable[[Any], str],
        format: Format,
    ) -> None:
        self.subject = subject
        self.key = key
        self.sink = sink
        self.prefix = prefix
        self.format = format

    async def body(self, input: Any, step: Step, ctx: JobContext) -> ExportRecord:
        prefix = check_key(self.prefix(input), what="prefix")
        plan = await self.subject.plan()
        statements = Statements(plan, self.subject.key_values(self.key(input)))
        sink = self.sink()
        tables = []
        for number, planned in enumerate(reversed(plan.tables)):
            ctx.progress(number, len(plan.tables) + len(self.subject.targets), note=planned.shown)
            parts = await self._table(step, plan, planned, statements, sink, prefix)
            tables.append(
                {
                    "table": planned.shown,
                    **planned.treatment.describe(),
                    "columns": list(planned.export_columns),
                    "rows": sum(p["rows"] for p in parts),
                    "parts": parts,
                }
            )
        targets = []
        for target, treatment in self.subject.targets:
            parts = await self._target(step, target, statements, sink, prefix)
            targets.append(
                {
                    "target": target.name,
                    **treatment.describe(),
                    "columns": list(target.columns),
                    "rows": sum(p["rows"] for p in parts),
                    "parts": parts,
                }
            )
        written = [p for entry in tables + targets for p in entry["parts"]]
        index = check_key(f"{prefix}/index.json")
        summary = {
            "subject": self.subject.name,
            "format": self.format,
            "parts": len(written),
            "rows": sum(p["rows"] for p in written),
            "bytes": sum(p["bytes"] for p in written),
        }
        await step.run(
            "index", self._index, sink, index, {**summary, "tables": tables, "targets": targets}
        )
        return {"index": index, **summary}  # type: ignore[typeddict-item]

    async def _table(
        self,
        step: Step,
        plan: Plan,
        planned: PlannedTable,
        statements: Statements,
        sink: ExportSink,
        prefix: str,
    ) -> list[dict[str, Any]]:
        folder = f"{prefix}/tables/{_segment(planned.shown)}"
        columns = list(planned.export_columns)
        if planned.table.name == plan.subject.name:
            name = step_name("export", planned.shown)
            out = await step.run(name, self._subject_part, statements, columns, sink, folder)
            return [_listed(out)] if out["part"] is not None else []
        parts: list[dict[str, Any]] = []
        for index, fk in enumerate(planned.keys):
            steps = ("export", planned.shown, fk.name)
            await _paged(step, steps, parts, self._page, statements, planned, index, sink, folder)
        return parts

    async def _page(
        self,
        cursor: list[str] | None,
        number: int,
        statements: Statements,
        planned: PlannedTable,
        index: int,
        sink: ExportSink,
        folder: str,
    ) -> dict[str, Any]:
        """One step: a page of parent keys, the rows in it, one part (none for no rows)."""
        batch = self.subject.batch
        columns = list(planned.export_columns)
        async with self.subject.connection() as conn:
            cur = await conn.execute(*statements.parent_page(planned.keys[index], cursor, batch))
            keys = [list(row) for row in await cur.fetchall()]
            rows: list[Any] = []
            if keys:
                cur = await conn.execute(*statements.select_page(planned, index, keys))
                rows = await cur.fetchall()
        written = await self._put(
            sink, folder, number, columns, [dict(zip(columns, r, strict=True)) for r in rows]
        )
        return {"cursor": keys[-1] if len(keys) == batch else None, **written}

    async def _subject_part(
        self, statements: Statements, columns: list[str], sink: ExportSink, folder: str
    ) -> dict[str, Any]:
        async with self.subject.connection() as conn:
            cur = await conn.execute(*statements.select_subject(columns))
            rows = await cur.fetchall()
        return await self._put(
            sink, folder, 0, columns, [dict(zip(columns, r, strict=True)) for r in rows]
        )

    async def _target(
        self,
        step: Step,
        target: SubjectTarget,
        statements: Statements,
        sink: ExportSink,
        prefix: str,
    ) -> list[dict[str, Any]]:
        folder = f"{prefix}/targets/{_segment(target.name)}"
        parts: list[dict[str, Any]] = []
        name = ("export-target", target.name)
        await _paged(step, name, parts, self._target_page, target, statements, sink, folder)
        return parts

    async def _target_page(
        self,
        cursor: Any,
        number: int,
        target: SubjectTarget,
        statements: Statements,
        sink: ExportSink,
        folder: str,
    ) -> dict[str, Any]:
        row = await subject_row(self.subject, statements)
        if row is None:
            return {"cursor": None, "part": None, "rows": 0, "bytes": 0}
        answer = await call(target.export_page, row, cursor)
        if (
            not isinstance(answer, tuple | list)
            or len(answer) != 2
            or not isinstance(answer[0], Sequence)
            or isinstance(answer[0], str | bytes)
        ):
            raise ExportRowInvalidError(
                f"target {target.name!r}: export_page answered a {type(answer).__name__}, not "
                "(rows, next_cursor)",
                target=target.name,
            )
        rows, after = answer
        written = await self._put(sink, folder, number, list(target.columns), list(rows))
        return {"cursor": after if rows else None, **written}

    async def _put(
        self,
        sink: ExportSink,
        folder: str,
        number: int,
        columns: list[str],
        rows: Sequence[Any],
    ) -> dict[str, Any]:
        """Encode ``rows`` as part ``number`` of ``folder`` and put it (nothing for no rows)."""
        if not rows:
            return {"part": None, "rows": 0, "bytes": 0}
        records = [{c: exported(row.get(c), self.format) for c in columns} for row in rows]
        data = encode_records(columns, records, format=self.format, header=number == 0)
        key = check_key(f"{folder}/part-{number:05d}.{self.format}")
        await asyncio.to_thread(sink.put, key, data)
        return {"part": key, "rows": len(rows), "bytes": len(data)}

    async def _index(self, sink: ExportSink, key: str, index: dict[str, Any]) -> dict[str, Any]:
        async with self.subject.connection() as conn:
            cur = await conn.execute(block("now"))
            now = (await cur.fetchone())[0]
        body = {"exported_at": now.isoformat(), **index}
        data = (json.dumps(body, indent=2, ensure_ascii=False) + "\n").encode()
        await asyncio.to_thread(sink.put, key, data)
        return {"key": key, "bytes": len(data)}


def subject_export(
    *,
    name: str,
    input: Any,
    tenant: Callable[[Any], str] | Literal["none"],
    subject: Subject,
    sink: Callable[[], ExportSink],
    prefix: Callable[[Any], str],
    format: Format = "ndjson",
    key: Callable[[Any], Any] | None = None,
    idempotency_key: Callable[[Any], str] | None = None,
    queue: str = "default",
    retry: Retry | None = None,
    timeout: Any = None,
    concurrency: int | Concurrency | None = None,
    on_settled: Callable[[Settled], Any] | None = None,
    registry: JobRegistry | None = None,
) -> JobHandle[Any, ExportRecord]:
    """Declare a job that exports everything of one subject to object storage.

    The run writes ``<prefix>/tables/<table>/part-NNNNN.<format>`` (one per page of parent
    keys per table, the CSV header in each table's part 0), ``<prefix>/targets/<name>/...``
    (one per target page), then ``<prefix>/index.json`` listing every part. Its result is an
    :class:`ExportRecord`. The plan, and its refusals, are the erase's.

    Args:
        name: the job's durable name (required).
        input: the input type (a pydantic model or any type ``TypeAdapter`` takes).
        tenant: ``(input) -> org id``, or ``"none"``.
        subject: what :func:`~jobs_subject.define_subject` answered.
        sink: ``() -> ExportSink`` (``lambda: local_sink("exports")``, ``s3_sink(...)``), called
            once per attempt.
        prefix: ``(input) -> key prefix``, e.g. ``lambda i: f"subjects/{i.user_id}"``.
        format: ``"ndjson"`` (default) or ``"csv"`` (RFC 4180, the formula guard on text).
        key: ``(input) -> the subject's key``; may be left out when the input model has exactly
            one field.
        idempotency_key: ``(input) -> str``; default ``prefix(input)``: one live export per prefix.
        queue: the queue (default ``"default"``).
        retry: the :class:`~jobs_core.Retry` policy; a killed attempt resumes at its page.
        timeout: whole-attempt deadline.
        concurrency: fleet-wide cap, as for :func:`jobs_core.job`.
        on_settled: hook told once per ending.
        registry: the job registry to join (default the process-wide one).

    Returns:
        The job's handle; ``await handle.enqueue(input)`` starts an export.

    Raises:
        JobDeclarationInvalidError: ``X_JOB_DECLARATION_INVALID`` listing every bad field.
        TenantRequiredError: ``X_JOB_TENANT_REQUIRED`` without ``tenant``.
        JobDuplicateError: ``X_JOB_DUPLICATE`` when another declaration holds ``name``.

    A run raises the plan's refusals (terminal), ``StorageKeyInvalidError``
    (``X_STORAGE_KEY_INVALID``) for a bad prefix and ``ExportRowInvalidError``
    (``X_EXPORT_ROW_INVALID``) for a target page that is not ``(rows, next_cursor)``.
    """
    site = caller_site()
    problems: list[str] = []
    check_subject(subject, problems)
    reader = key_reader(input, key, problems)
    if format not in ("csv", "ndjson"):
        problems.append(f"format: must be 'csv' or 'ndjson', got {format!r}")
    for field, value in (("sink", sink), ("prefix", prefix)):
        if not callable(value):
            problems.append(f"{field}: required, a function")
    if idempotency_key is not None and not callable(idempotency_key):
        problems.append("idempotency_key: must be a function (input) -> str")
    export = _Export(subject, reader, sink, prefix, format)
    options = {
        "name": name,
        "input": input,
        "tenant": tenant,
        "idempotency_key": idempotency_key or (lambda i: str(prefix(i))),
        "queue": queue,
        "retry": retry,
        "timeout": timeout,
        "concurrency": concurrency,
        "on_settled": on_settled,
    }
    return declare("subject_export", options, problems, export.body, site, registry)


__all__ = ["ExportRecord", "subject_export"]
