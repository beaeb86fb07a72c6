"""``export_rows()``: a paged read streamed to object storage, one part per page.

The job's body asks the source for one page after another; each page is one ``step.run``
(``part:0``, ``part:1``, ...) that encodes the page, puts it as ``<prefix>/part-NNNNN.<ext>`` and
answers the checkpoint ``{cursor, rows, bytes}``: the cursor to read from next and two running
counters, never the rows. A killed run replays the completed steps from storage and resumes at the
first page without a checkpoint; that page's part key is its index, so running it again rewrites
the same object. ``<prefix>/manifest.json`` is written last, in a step of its own, so a reader
who sees the manifest knows every part it counts is there.

Holding the rows of a page only (``batch`` of them) is what keeps memory flat however large the
export: the rejected alternative, one object streamed by a multipart upload, holds no more memory
but cannot be resumed by a replay without persisting upload state that expires on its own.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, Protocol, TypedDict

from jobs_core import CancelSignal, JobContext, JobHandle, JobRegistry, Retry, Settled, Step
from jobs_core.errors import ExportPartTooLargeError, ExportRowInvalidError
from jobs_core.limits import Concurrency
from jobs_core.types import JSONValue
from jobs_import_export._csv import CellUnholdable, csv_cell, header_line
from jobs_import_export._declare import (
    Format,
    JobOptions,
    call_from_thread,
    caller_site,
    check_callable,
    check_columns,
    check_format,
    check_int,
    declare,
)
from jobs_import_export._ndjson import json_value, ndjson_line
from jobs_import_export._storage import ExportSink, check_key, join_key
from jobs_import_export._untrusted import shown

DEFAULT_EXPORT_BATCH = 5_000
"""Rows per page (and so per part) unless ``batch=`` says otherwise."""

DEFAULT_MAX_PART_BYTES = 32 * 1024 * 1024
"""The largest encoded part accepted unless ``max_part_bytes=`` says otherwise (32 MiB)."""

EXTENSIONS: dict[str, str] = {"csv": "csv", "ndjson": "ndjson"}


class PageReader(Protocol):
    """Reads one page of the rows to export: ``reader(cursor, limit) -> (rows, next_cursor)``.

    ``cursor`` is ``None`` for the first page, then whatever the previous call answered as
    ``next_cursor`` (it is stored in the step's checkpoint, so it must be JSON: a key, a tuple of
    keys as a list, an ISO timestamp). Answer at most ``limit`` rows and ``None`` as
    ``next_cursor`` after the last page. Read by key (``WHERE id > cursor ORDER BY id LIMIT n``),
    never by ``OFFSET``: a keyset read costs the same on page 1 and page 2,000, and rows inserted
    meanwhile do not shift later pages. A page of no rows ends the export. May be a coroutine
    function; a plain function runs in a worker thread.
    """

    def __call__(
        self, cursor: JSONValue, limit: int, /
    ) -> tuple[Sequence[Any], JSONValue] | Awaitable[tuple[Sequence[Any], JSONValue]]: ...


class ExportReport(TypedDict):
    """The result of an export run (the job's ``result``).

    Attributes:
        rows: rows written.
        parts: part objects written (``part-00000`` to ``part-<parts - 1>``).
        bytes: bytes written across the parts (the manifest excluded).
        manifest: the manifest's key.
    """

    rows: int
    parts: int
    bytes: int
    manifest: str


class _Export:
    """One declaration's settings and the code its body runs."""

    def __init__(
        self,
        *,
        prefix: Callable[[Any], str],
        source: Callable[[JobContext, Any], PageReader],
        columns: list[str],
        row: Callable[[Any], Mapping[str, Any]] | None,
        sink: Callable[[], ExportSink],
        format: Format,
        batch: int,
        max_part_bytes: int,
        rate: float | None,
    ) -> None:
        self.prefix = prefix
        self.source = source
        self.columns = columns
        self.column_set = frozenset(columns)
        self.row = row
        self.sink = sink
        self.format = format
        self.batch = batch
        self.max_part_bytes = max_part_bytes
        self.rate = rate

    async def body(self, input: Any, step: Step, ctx: JobContext) -> ExportReport:
        prefix = check_key(self.prefix(input), what="prefix")
        reader = self.source(ctx, input)
        sink = self.sink()
        loop = asyncio.get_running_loop()
        checkpoint: dict[str, Any] = {"cursor": None, "rows": 0, "bytes": 0}
        parts = 0
        while True:
            ctx.cancel.raise_if_cancelled()
            answer = await step.run(
                f"part:{parts}", self._page, loop, reader, sink, prefix, parts, checkpoint
            )
            assert isinstance(answer, dict)
            wrote = parts == 0 or answer["rows"] > checkpoint["rows"]
            parts += 1 if wrote else 0
            checkpoint = answer
            ctx.progress(checkpoint["rows"], None, note=f"{parts} parts")
            if checkpoint["cursor"] is None:
                break
        manifest = join_key(prefix, "manifest.json")
        await step.run("manifest", self._manifest, sink, manifest, parts, checkpoint)
        return {
            "rows": checkpoint["rows"],
            "parts": parts,
            "bytes": checkpoint["bytes"],
            "manifest": manifest,
        }

    def _page(
        self,
        loop: asyncio.AbstractEventLoop,
        reader: PageReader,
        sink: ExportSink,
        prefix: str,
        index: int,
        checkpoint: dict[str, Any],
        *,
        cancel: CancelSignal,
    ) -> dict[str, Any]:
        """Read, encode and put one page; answer its checkpoint (on a worker thread, one hop)."""
        started = time.monotonic()
        answer = call_from_thread(loop, reader, checkpoint["cursor"], self.batch)
        rows, cursor = _page_of(answer, index)
        if not rows and index > 0:
            return {"cursor": None, "rows": checkpoint["rows"], "bytes": checkpoint["bytes"]}
        data = self._encode(rows, index)
        if len(data) > self.max_part_bytes:
            raise ExportPartTooLargeError(
                f"part {index} encodes to {len(data):,} bytes, over max_part_bytes="
                f"{self.max_part_bytes:,}; lower batch= (now {self.batch:,} rows a page)",
                part=index,
                bytes=len(data),
                max_part_bytes=self.max_part_bytes,
                batch=self.batch,
            )
        sink.put(join_key(prefix, f"part-{index:05d}.{EXTENSIONS[self.format]}"), data)
        next_cursor = cursor if rows else None
        if self.rate is not None and next_cursor is not None:
            remaining = started + 1 / self.rate - time.monotonic()
            # The wait ends early when the attempt is cancelled (a drain, a timeout).
            if remaining > 0 and cancel.wait_sync(remaining):
                cancel.raise_if_cancelled()
        return {
            "cursor": next_cursor,
            "rows": checkpoint["rows"] + len(rows),
            "bytes": checkpoint["bytes"] + len(data),
        }

    def _encode(self, rows: Sequence[Any], index: int) -> bytes:
        lines: list[str] = []
        if index == 0 and self.format == "csv":
            lines.append(header_line(self.columns))
        for number, item in enumerate(rows):
            values = self.row(item) if self.row is not None else item
            if not isinstance(values, Mapping):
                raise ExportRowInvalidError(
                    f"row {number} of part {index}: row() answered a "
                    f"{type(values).__name__}, not a mapping of column to value",
                    part=index,
                    row=number,
                )
            if not values.keys() <= self.column_set:
                undeclared = sorted(str(key) for key in values.keys() - self.column_set)
                raise ExportRowInvalidError(
                    f"row {number} of part {index}: row() answered "
                    f"{len(undeclared)} key(s) not in columns: "
                    + ", ".join(shown(key) for key in undeclared[:5]),
                    part=index,
                    row=number,
                    undeclared=len(undeclared),
                )
            try:
                lines.append(self._line(values))
            except CellUnholdable:
                raise self._unholdable(values, index, number) from None
        try:
            return "".join(lines).encode("utf-8")
        except UnicodeEncodeError:
            raise ExportRowInvalidError(
                f"part {index}: a text cell holds a lone surrogate, which UTF-8 cannot encode",
                part=index,
            ) from None

    def _line(self, values: Mapping[str, Any]) -> str:
        if self.format == "csv":
            return ",".join([csv_cell(values.get(name)) for name in self.columns]) + "\n"
        return ndjson_line({name: json_value(values.get(name)) for name in self.columns})

    def _unholdable(
        self, values: Mapping[str, Any], index: int, number: int
    ) -> ExportRowInvalidError:
        convert = csv_cell if self.format == "csv" else json_value
        for name in self.columns:
            try:
                convert(values.get(name))
            except CellUnholdable as exc:
                return ExportRowInvalidError(
                    f"row {number} of part {index}, column {name!r}: a {exc} has no "
                    f"{self.format} form",
                    part=index,
                    row=number,
                    column=name,
                )
        raise AssertionError("a cell failed to convert once, then converted")

    def _manifest(self, sink: ExportSink, key: str, parts: int, checkpoint: dict[str, Any]) -> None:
        manifest = {
            "format": self.format,
            "columns": self.columns,
            "parts": parts,
            "rows": checkpoint["rows"],
            "bytes": checkpoint["bytes"],
        }
        sink.put(key, (json.dumps(manifest, indent=2) + "\n").encode())


def _page_of(answer: Any, index: int) -> tuple[Sequence[Any], JSONValue]:
    if (
        not isinstance(answer, tuple | list)
        or len(answer) != 2
        or not isinstance(answer[0], Sequence)
        or isinstance(answer[0], str | bytes)
    ):
        raise ExportRowInvalidError(
            f"page {index}: the source's reader answered a {type(answer).__name__}, not "
            "(rows, next_cursor)",
            part=index,
        )
    return answer[0], answer[1]


def export_rows(
    *,
    name: str,
    input: Any,
    tenant: Callable[[Any], str] | Literal["none"],
    prefix: Callable[[Any], str],
    source: Callable[[JobContext, Any], PageReader],
    columns: Sequence[str],
    sink: Callable[[], ExportSink],
    row: Callable[[Any], Mapping[str, Any]] | None = None,
    format: Format = "csv",
    batch: int = DEFAULT_EXPORT_BATCH,
    max_part_bytes: int = DEFAULT_MAX_PART_BYTES,
    rate: float | None = None,
    idempotency_key: Callable[[Any], str] | None = None,
    queue: str = "default",
    retry: Retry | None = None,
    timeout: Any = None,
    concurrency: int | Concurrency | None = None,
    on_settled: Callable[[Settled], Any] | None = None,
    registry: JobRegistry | None = None,
) -> JobHandle[Any, ExportReport]:
    r"""Declare a job that streams a paged read to object storage, one part per page.

    The run writes ``<prefix>/part-00000.<ext>``, ``part-00001``, ... (one per page of ``batch``
    rows; the header in part 0 only, every line ending in ``\n``, so ``cat part-*`` is one valid
    file), then ``<prefix>/manifest.json`` (``format``, ``columns``, ``parts``, ``rows``,
    ``bytes``). Its result is an :class:`ExportReport`.

    Args:
        name: the job's durable name (required).
        input: the input type (a pydantic model or any type ``TypeAdapter`` takes).
        tenant: ``(input) -> org id``, or ``"none"`` (then ``source`` and ``row`` run with no org:
            a tenant-scoped read fails closed; there is no cross-tenant escape).
        prefix: ``(input) -> key prefix`` of the export's objects, e.g.
            ``lambda i: f"exports/{i.org_id}/{i.export_id}"``.
        source: ``(ctx, input) -> PageReader``, called once per attempt.
        columns: the columns, in file order; ``row()`` may answer no other key.
        sink: ``() -> ExportSink``, called once per attempt (``lambda: s3_sink("exports")``).
        row: ``(item) -> {column: value}``; a key not in ``columns`` is refused, a column it
            leaves out is empty (``None``). Default: the items already are such mappings.
        format: ``"csv"`` (RFC 4180, ``\n`` line ends, text cells starting with ``= + - @``,
            TAB or CR prefixed with ``'``, numbers untouched) or ``"ndjson"``.
        batch: rows per page and part (default 5,000).
        max_part_bytes: the largest encoded part (default 32 MiB).
        rate: at most this many pages per second (``None``: as fast as the source answers). The
            wait happens inside the page's step and ends early when the attempt is cancelled.
        idempotency_key: ``(input) -> key``; default ``prefix(input)``: one live export per
            prefix.
        queue: the queue (default ``"default"``).
        retry: the :class:`~jobs_core.Retry` policy (a killed or failed page resumes from the
            last checkpoint on the next attempt).
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

    A run raises (terminal, so the row is dead-lettered at once):
    ``ExportPartTooLargeError`` (``X_EXPORT_PART_TOO_LARGE``) for a page over ``max_part_bytes``;
    ``ExportRowInvalidError`` (``X_EXPORT_ROW_INVALID``) for a key outside ``columns``, a value
    with no CSV/JSON form or a reader answering something other than ``(rows, next_cursor)``;
    ``StorageKeyInvalidError`` (``X_STORAGE_KEY_INVALID``) for a bad prefix. The sink's own
    errors (a refused PUT) are retried by ``retry``.
    """
    site = caller_site()
    problems: list[str] = []
    names = check_columns(problems, columns)
    check_format(problems, format)
    check_callable(problems, "prefix", prefix, "(input) -> key prefix")
    check_callable(problems, "source", source, "(ctx, input) -> reader(cursor, limit)")
    check_callable(problems, "sink", sink, "() -> ExportSink")
    if row is not None:
        check_callable(problems, "row", row, "(item) -> {column: value}")
    check_int(problems, "batch", batch, minimum=1)
    check_int(problems, "max_part_bytes", max_part_bytes, minimum=1)
    if rate is not None and (
        isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate < float("inf")
    ):
        problems.append(f"rate: must be a positive number of pages per second, got {rate!r}")
    if idempotency_key is not None:
        check_callable(problems, "idempotency_key", idempotency_key, "(input) -> str")
    declared = _Export(
        prefix=prefix,
        source=source,
        columns=names,
        row=row,
        sink=sink,
        format=format,
        batch=batch,
        max_part_bytes=max_part_bytes,
        rate=rate,
    )

    options = JobOptions(
        name=name,
        input=input,
        tenant=tenant,
        idempotency_key=idempotency_key or (lambda i: str(prefix(i))),
        queue=queue,
        retry=retry,
        timeout=timeout,
        concurrency=concurrency,
        on_settled=on_settled,
        registry=registry,
    )
    return declare("export_rows", options, problems, declared.body, site)


__all__ = [
    "DEFAULT_EXPORT_BATCH",
    "DEFAULT_MAX_PART_BYTES",
    "ExportReport",
    "PageReader",
    "export_rows",
]
