"""``import_rows()``: one object read a page at a time, through a schema, into the app's ``handle``.

The body records the object's size (step ``size``), then runs one step per page (``page:0``,
``page:1``, ...). A page reads ``page_bytes`` from the checkpointed offset, keeps the complete
records (boundaries found on bytes, :mod:`._records`), validates them ``batch`` at a time and hands
each batch to ``handle``; its output ``{offset, line, rows, rejected, error_part, header}`` is the
checkpoint. Bytes after the last complete record are not carried anywhere: the next page starts
there and reads them again, so a killed attempt resumes at an offset and nothing else.

``handle`` runs at least once per page: a crash after it wrote a batch but before the page's
checkpoint landed re-runs that page on the next attempt, so ``handle`` must write idempotently
(an upsert on the row's key).

Refused rows go to ``<errors prefix>/<run_id>/errors-NNNNN.ndjson``, one object per page that
refused any, as ``{line, field, code}`` lines: the run id keeps two imports of one file apart, and
the value is never written. The alternative of keeping refusals in the step output was rejected:
step outputs live as long as the run and are shown by ``jobsctl show``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from pydantic import BaseModel, TypeAdapter

from jobs_core import JobContext, JobHandle, JobRegistry, Retry, Settled, Step
from jobs_core.errors import ImportSourceChangedError, ImportTooManyErrorsError
from jobs_core.limits import Concurrency
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
from jobs_import_export._import_page import Layout, Page, Refusal, no_header
from jobs_import_export._storage import ExportSink, ImportSource, check_key, join_key

DEFAULT_PAGE_BYTES = 1024 * 1024
"""Bytes read per page (1 MiB) unless ``page_bytes=`` says otherwise."""

DEFAULT_MAX_RECORD_BYTES = 64 * 1024
"""The longest record accepted (64 KiB) unless ``max_record_bytes=`` says otherwise."""

DEFAULT_IMPORT_BATCH = 500
"""Records handed to ``handle`` at a time unless ``batch=`` says otherwise."""

DEFAULT_MAX_ROW_ERRORS = 1_000
"""Refused rows a run tolerates unless ``max_row_errors=`` says otherwise."""


@dataclass(frozen=True, slots=True)
class ErrorSink:
    """Where an import writes the rows it refused.

    Attributes:
        sink: ``() -> ExportSink``, called once per attempt.
        prefix: ``(input) -> key prefix``; a run writes under ``<prefix>/<run_id>/``.
    """

    sink: Callable[[], ExportSink]
    prefix: Callable[[Any], str]


class ImportReport(TypedDict):
    """The result (and, while it runs, the progress note) of an import run.

    Attributes:
        rows: rows handed to ``handle``.
        rejected: rows refused (listed in the error report).
        parts: pages read (one step each).
        bytes: bytes of the object read.
        error_prefix: the run's error-report prefix, ``<errors prefix>/<run_id>``; its
            ``errors-NNNNN.ndjson`` objects exist only when ``rejected > 0``.
    """

    rows: int
    rejected: int
    parts: int
    bytes: int
    error_prefix: str


class _Import:
    """One declaration's settings and the code its body runs."""

    def __init__(
        self,
        *,
        source: Callable[[], ImportSource],
        key: Callable[[Any], str],
        layout: Layout,
        handle: Callable[[list[Any], Any], Any],
        errors: ErrorSink,
        page_bytes: int,
        max_row_errors: int,
    ) -> None:
        self.source = source
        self.key = key
        self.layout = layout
        self.handle = handle
        self.errors = errors
        self.page_bytes = page_bytes
        self.max_row_errors = max_row_errors

    async def body(self, input: Any, step: Step, ctx: JobContext) -> ImportReport:
        key = check_key(self.key(input))
        error_prefix = join_key(self.errors.prefix(input), str(ctx.run_id))
        source = self.source()
        error_sink = self.errors.sink()
        loop = asyncio.get_running_loop()
        size = await step.run("size", source.size, key)
        assert isinstance(size, int)
        checkpoint: dict[str, Any] = {
            "offset": 0,
            "line": 0,
            "rows": 0,
            "rejected": 0,
            "error_part": 0,
            "header": None,
        }
        parts = 0
        while checkpoint["offset"] < size:
            ctx.cancel.raise_if_cancelled()
            run = _Run(self, input, source, error_sink, key, size, error_prefix, parts, loop)
            answer = await step.run(f"page:{parts}", run.page, checkpoint)
            assert isinstance(answer, dict)
            checkpoint = answer
            parts += 1
            ctx.progress(
                checkpoint["offset"],
                size,
                note=f"{checkpoint['rows']} rows, {checkpoint['rejected']} rejected",
            )
        if self.layout.format == "csv" and checkpoint["header"] is None:
            raise no_header(self.layout.columns)
        return _report(checkpoint, parts, error_prefix)


@dataclass(frozen=True, slots=True)
class _Run:
    """What one attempt's page steps share."""

    declared: _Import
    input: Any
    source: ImportSource
    error_sink: ExportSink
    key: str
    size: int
    error_prefix: str
    index: int
    loop: asyncio.AbstractEventLoop

    def page(self, checkpoint: dict[str, Any]) -> dict[str, Any]:
        """Read, validate and hand over one page; answer its checkpoint.

        Runs on a worker thread of its own (a sync step function), the whole page in one hop:
        a hop per batch costs a thread wake-up and a loop wake-up each, which on a loaded
        machine cost more than the batch. An async ``handle`` runs on the attempt's loop while
        this thread waits for it.
        """
        declared = self.declared
        offset = checkpoint["offset"]
        length = min(declared.page_bytes, self.size - offset)
        data = self.source.read_range(self.key, offset, length)
        if len(data) < length:
            raise ImportSourceChangedError(
                f"the object answered {len(data):,} bytes at offset {offset:,} where "
                f"{length:,} were due (it had {self.size:,} bytes when the run began)",
                offset=offset,
                size=self.size,
            )
        page = Page(
            declared.layout,
            data[:length],
            offset=offset,
            line=checkpoint["line"],
            header=checkpoint["header"],
            at_eof=offset + length >= self.size,
        )
        refusals: list[Refusal] = []
        rows, rejected = checkpoint["rows"], checkpoint["rejected"]
        for batch in page.batches():
            refusals += batch.refusals
            rejected += batch.rejected
            if rejected > declared.max_row_errors:
                written = self._write(checkpoint["error_part"], refusals)
                report = _report(
                    {**checkpoint, "rows": rows, "rejected": rejected, "offset": offset},
                    self.index + 1,
                    self.error_prefix,
                )
                raise ImportTooManyErrorsError(
                    f"{rejected:,} rows refused, over max_row_errors={declared.max_row_errors:,}: "
                    f"the run stopped at line {batch.last_line:,} without handling that batch; "
                    f"{written} lists this page's refusals under the run's error prefix",
                    **report,
                )
            if batch.rows:
                call_from_thread(self.loop, declared.handle, batch.rows, self.input)
                rows += len(batch.rows)
        error_part = checkpoint["error_part"]
        if refusals:
            self._write(error_part, refusals)
            error_part += 1
        return {
            "offset": offset + page.consumed,
            "line": checkpoint["line"] + page.lines,
            "rows": rows,
            "rejected": rejected,
            "error_part": error_part,
            "header": page.header,
        }

    def _write(self, part: int, refusals: list[Refusal]) -> str:
        name = f"errors-{part:05d}.ndjson"
        data = "".join(
            json.dumps(refusal.as_json(), separators=(",", ":")) + "\n" for refusal in refusals
        ).encode()
        self.error_sink.put(join_key(self.error_prefix, name), data)
        return name


def _report(checkpoint: dict[str, Any], parts: int, error_prefix: str) -> ImportReport:
    return {
        "rows": checkpoint["rows"],
        "rejected": checkpoint["rejected"],
        "parts": parts,
        "bytes": checkpoint["offset"],
        "error_prefix": error_prefix,
    }


def _schema_adapter(problems: list[str], schema: Any, columns: list[str]) -> TypeAdapter[Any]:
    """Answer ``TypeAdapter(schema)``; add a problem if it cannot be built or cannot pass."""
    try:
        adapter: TypeAdapter[Any] = TypeAdapter(schema)
    except Exception as exc:
        problems.append(f"schema: {schema!r} is not a type pydantic can validate ({exc})")
        return TypeAdapter(Any)
    if isinstance(schema, type) and issubclass(schema, BaseModel) and columns:
        required = [
            info.alias or field for field, info in schema.model_fields.items() if info.is_required()
        ]
        absent = [name for name in required if name not in columns]
        if absent:
            problems.append(
                f"schema: required field(s) {absent} are not in columns, so every row would be "
                "refused"
            )
    return adapter


def import_rows(
    *,
    name: str,
    input: Any,
    tenant: Callable[[Any], str] | Literal["none"],
    source: Callable[[], ImportSource],
    key: Callable[[Any], str],
    columns: Sequence[str],
    schema: Any,
    handle: Callable[[list[Any], Any], Any],
    errors: ErrorSink,
    format: Format = "csv",
    batch: int = DEFAULT_IMPORT_BATCH,
    page_bytes: int = DEFAULT_PAGE_BYTES,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    max_row_errors: int = DEFAULT_MAX_ROW_ERRORS,
    idempotency_key: Callable[[Any], str] | None = None,
    queue: str = "default",
    retry: Retry | None = None,
    timeout: Any = None,
    concurrency: int | Concurrency | None = None,
    on_settled: Callable[[Settled], Any] | None = None,
    registry: JobRegistry | None = None,
) -> JobHandle[Any, ImportReport]:
    """Declare a job that imports one object a page at a time through ``schema`` into ``handle``.

    Its result is an :class:`ImportReport` ``{rows, rejected, parts, bytes, error_prefix}``; the
    same counts are its progress while it runs (``done`` = bytes read, ``total`` = the object's
    size).

    Args:
        name: the job's durable name (required).
        input: the input type (a pydantic model or any type ``TypeAdapter`` takes).
        tenant: ``(input) -> org id``, or ``"none"`` (then ``handle`` runs with no org: a
            tenant-scoped write fails closed; there is no cross-tenant escape).
        source: ``() -> ImportSource``, called once per attempt (``lambda: s3_source("imports")``).
        key: ``(input) -> the object's key``.
        columns: the columns. CSV: the header must name exactly these, in any order. NDJSON: the
            keys an object may have.
        schema: what each row validates into: a pydantic model (or any type ``TypeAdapter``
            takes), given ``{column: cell}``. CSV cells are text, an empty cell ``None`` and a
            quoted ``""`` the empty string, coerced by pydantic's lax mode (``"12"`` to ``12``).
        handle: ``(rows, input)``, given at most ``batch`` validated rows at a time, in file
            order; sync (runs in a worker thread) or async. Runs at least once per page: write
            idempotently.
        errors: the :class:`ErrorSink` refused rows are reported to.
        format: ``"csv"`` (RFC 4180: quoted newlines, CRLF and a UTF-8 BOM handled) or
            ``"ndjson"``.
        batch: records per ``handle`` call (default 500).
        page_bytes: bytes read per page, one step each (default 1 MiB); must exceed
            ``max_record_bytes`` so every page holds a whole record.
        max_record_bytes: the longest record (default 64 KiB).
        max_row_errors: refused rows tolerated (default 1,000); ``0`` stops at the first.
        idempotency_key: ``(input) -> key``; default ``key(input)``: one live import per object.
        queue: the queue (default ``"default"``).
        retry: the :class:`~jobs_core.Retry` policy (an attempt resumes at the last checkpoint).
        timeout: whole-attempt deadline.
        concurrency: fleet-wide cap, as for :func:`jobs_core.job`.
        on_settled: hook told once per ending.
        registry: the job registry to join (default the process-wide one).

    Returns:
        The job's handle; ``await handle.enqueue(input)`` starts an import.

    Raises:
        JobDeclarationInvalidError: ``X_JOB_DECLARATION_INVALID`` listing every bad field.
        TenantRequiredError: ``X_JOB_TENANT_REQUIRED`` without ``tenant``.
        JobDuplicateError: ``X_JOB_DUPLICATE`` when another declaration holds ``name``.

    A run raises (terminal, so the row is dead-lettered at once):
    ``ImportHeaderMismatchError`` (``X_IMPORT_HEADER_MISMATCH``) for a CSV header that is not
    ``columns``, or a file with no header (empty, a BOM only, blank lines only);
    ``ImportRecordTooLargeError`` (``X_IMPORT_RECORD_TOO_LARGE``); ``ImportTooManyErrorsError``
    (``X_IMPORT_TOO_MANY_ERRORS``, its report in ``meta``, the refusals written first);
    ``ImportSourceChangedError`` (``X_IMPORT_SOURCE_CHANGED``); ``StorageNotFoundError``
    (``X_STORAGE_NOT_FOUND``); ``StorageKeyInvalidError`` (``X_STORAGE_KEY_INVALID``). Errors
    ``handle`` raises are retried by ``retry``; a row that fails ``schema`` is refused, not
    raised.
    """
    site = caller_site()
    problems: list[str] = []
    names = check_columns(problems, columns)
    check_format(problems, format)
    check_callable(problems, "source", source, "() -> ImportSource")
    check_callable(problems, "key", key, "(input) -> the object's key")
    check_callable(problems, "handle", handle, "(rows, input)")
    if not isinstance(errors, ErrorSink):
        problems.append("errors: required, ErrorSink(sink=lambda: ..., prefix=lambda input: ...)")
    else:
        check_callable(problems, "errors.sink", errors.sink, "() -> ExportSink")
        check_callable(problems, "errors.prefix", errors.prefix, "(input) -> key prefix")
    check_int(problems, "batch", batch, minimum=1)
    check_int(problems, "max_row_errors", max_row_errors, minimum=0)
    sizes_ok = check_int(problems, "max_record_bytes", max_record_bytes, minimum=1)
    sizes_ok = check_int(problems, "page_bytes", page_bytes, minimum=2) and sizes_ok
    if sizes_ok and page_bytes <= max_record_bytes:
        problems.append(
            f"page_bytes ({page_bytes:,}) must exceed max_record_bytes "
            f"({max_record_bytes:,}), so every page holds a whole record"
        )
    if idempotency_key is not None:
        check_callable(problems, "idempotency_key", idempotency_key, "(input) -> str")
    adapter = _schema_adapter(problems, schema, names)
    declared = _Import(
        source=source,
        key=key,
        layout=Layout(
            format=str(format),
            columns=tuple(names),
            row=adapter,
            batch=batch,
            max_record_bytes=max_record_bytes,
        ),
        handle=handle,
        errors=errors,
        page_bytes=page_bytes,
        max_row_errors=max_row_errors,
    )

    options = JobOptions(
        name=name,
        input=input,
        tenant=tenant,
        idempotency_key=idempotency_key or (lambda i: str(key(i))),
        queue=queue,
        retry=retry,
        timeout=timeout,
        concurrency=concurrency,
        on_settled=on_settled,
        registry=registry,
    )
    return declare("import_rows", options, problems, declared.body, site)


__all__ = [
    "DEFAULT_IMPORT_BATCH",
    "DEFAULT_MAX_RECORD_BYTES",
    "DEFAULT_MAX_ROW_ERRORS",
    "DEFAULT_PAGE_BYTES",
    "ErrorSink",
    "ImportReport",
    "import_rows",
]
