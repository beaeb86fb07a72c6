"""Values in and out: JSON text the database accepts, request arrays, and records from rows.

The driver refuses, before any statement, what Postgres would refuse later (a NUL character, a
value with no JSON form, a naive instant), with the same ``X_DRIVER_REQUEST_INVALID`` the memory
driver raises (FIELD-FAILURES C22: never a failure after the caller was told "enqueued").
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from jobs_core.driver import check_enqueue_request
from jobs_core.errors import DriverRequestInvalidError, JobPageInvalidError
from jobs_core.serialization import json_text_has_surrogate
from jobs_core.types import EnqueueRequest, JobInfo, JobState, JSONValue, StepRecord
from jobs_pg._db import Row, utc

_ENCODE = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode
# A JSON ``\u0000`` escape that is not itself an escaped backslash followed by "u0000".
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
_CURSOR = re.compile(r"pg1\|(-?\d{1,20})\|([0-9a-f]{32})")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)


def json_text(value: JSONValue, what: str) -> str:
    """Answer ``value`` as JSON text ``jsonb`` accepts.

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` when ``value`` has no JSON form
            (an arbitrary object, a cycle, ``NaN``, an infinity) or holds a NUL character or a
            lone surrogate (which ``jsonb`` refuses with a message quoting the text around it).
    """
    try:
        text = _ENCODE(value)
    except (TypeError, ValueError) as exc:
        raise DriverRequestInvalidError(f"{what} is not a JSON value: {exc}", field=what) from exc
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise DriverRequestInvalidError(
            f"{what} holds a NUL character (U+0000), which no driver can store", field=what
        )
    if json_text_has_surrogate(text):
        raise DriverRequestInvalidError(
            f"{what} holds a lone surrogate (U+D800..U+DFFF), which UTF-8 cannot encode",
            field=what,
        )
    return text


def text_value(value: str | None, what: str) -> str | None:
    """Answer ``value`` if Postgres ``text`` can hold it (no NUL character).

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a NUL character.
    """
    if value is not None and "\x00" in value:
        raise DriverRequestInvalidError(
            f"{what} holds a NUL character (U+0000), which no driver can store", field=what
        )
    return value


def aware(instant: datetime, what: str) -> datetime:
    """Answer an aware instant in UTC; a naive one is ``X_DRIVER_REQUEST_INVALID``."""
    if instant.utcoffset() is None:
        raise DriverRequestInvalidError(f"{what} must be an aware datetime (UTC)", field=what)
    return instant.astimezone(UTC)


def _refuse_values(req: EnqueueRequest) -> None:
    """Raise the ``X_DRIVER_REQUEST_INVALID`` naming the field of ``req`` Postgres cannot hold."""
    json_text(req.input, "input")
    for what, value in (
        ("name", req.name),
        ("queue", req.queue),
        ("idempotency_key", req.idempotency_key),
        ("tenant_id", req.tenant_id),
        ("traceparent", req.traceparent),
        ("enqueued_by", req.enqueued_by),
    ):
        text_value(value, what)


def request_arrays(reqs: Sequence[EnqueueRequest]) -> dict[str, list[Any]]:
    """Validate enqueue requests and answer the column arrays ``outbox_stage`` unnests.

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty name, queue or key,
            ``max_attempts`` below 1, a naive ``run_at``, or a value Postgres cannot hold.
    """
    arrays: dict[str, list[Any]] = {
        key: []
        for key in (
            "ids",
            "run_ids",
            "names",
            "queues",
            "inputs",
            "keys",
            "tenants",
            "max_attempts",
            "run_ats",
            "delays",
            "traceparents",
            "enqueued_bys",
            "order_keys",
            "priorities",
        )
    }
    for req in reqs:
        check_enqueue_request(req)
        arrays["ids"].append(req.id)
        arrays["run_ids"].append(req.run_id)
        arrays["names"].append(text_value(req.name, "name"))
        arrays["queues"].append(text_value(req.queue, "queue"))
        arrays["inputs"].append(json_text(req.input, "input"))
        arrays["keys"].append(text_value(req.idempotency_key, "idempotency_key"))
        arrays["tenants"].append(text_value(req.tenant_id, "tenant_id"))
        arrays["max_attempts"].append(req.max_attempts)
        arrays["run_ats"].append(None if req.run_at is None else aware(req.run_at, "run_at"))
        arrays["delays"].append(max(req.delay_ms, 0))
        arrays["traceparents"].append(text_value(req.traceparent, "traceparent"))
        arrays["enqueued_bys"].append(text_value(req.enqueued_by, "enqueued_by"))
        arrays["order_keys"].append(text_value(req.order_key, "order_key"))
        arrays["priorities"].append(req.priority)
    return arrays


def enqueue_params(reqs: Sequence[EnqueueRequest]) -> dict[str, str]:
    """Validate enqueue requests and answer the ``enqueue`` block's parameter: ``{"rows": ...}``.

    ``rows`` is JSON text: an array with one object per request, keyed by column name, the input
    included as JSON. One JSON text rather than a dozen typed arrays: psycopg dumps a list
    element by element (a regex per text element), which cost more than the statement itself
    at 1,000 rows, while one encode of the whole batch runs in C, and the NUL check (a NUL in
    any text or in the input is a JSON ``u0000`` escape in it) scans it once. The server's row
    estimate for a JSON recordset does not depend on the batch size either, so the prepared
    statement keeps one generic plan (a batch-sized estimate made Postgres plan every single
    enqueue again, and JIT-compile batches).

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty name, queue or key,
            ``max_attempts`` below 1, a naive ``run_at``, or a value Postgres cannot hold (an
            input with no JSON form, a NUL character).
    """
    rows: list[dict[str, Any]] = []
    for req in reqs:
        check_enqueue_request(req)
        rows.append(
            {
                "id": req.id.hex,
                "run_id": req.run_id.hex,
                "name": req.name,
                "queue": req.queue,
                "input": req.input,
                "idempotency_key": req.idempotency_key,
                "tenant_id": req.tenant_id,
                "max_attempts": req.max_attempts,
                "run_at": None if req.run_at is None else aware(req.run_at, "run_at").isoformat(),
                "delay_ms": max(req.delay_ms, 0),
                "traceparent": req.traceparent,
                "enqueued_by": req.enqueued_by,
                "priority": req.priority,
                "parent_run_id": None if req.parent_run_id is None else req.parent_run_id.hex,
            }
        )
    try:
        text = _ENCODE(rows)
    except (TypeError, ValueError) as exc:
        for req in reqs:
            _refuse_values(req)
        raise DriverRequestInvalidError(f"an enqueue request is not JSON: {exc}") from exc
    if ("\\u0000" in text and _NUL_ESCAPE.search(text)) or json_text_has_surrogate(text):
        for req in reqs:
            _refuse_values(req)
    return {"rows": text}


def debounce_params(req: EnqueueRequest) -> dict[str, Any]:
    """Validate one debounced request and answer the ``enqueue_debounce`` block's parameters.

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` as :func:`enqueue_params`.
    """
    check_enqueue_request(req)
    return {
        "id": req.id,
        "run_id": req.run_id,
        "name": text_value(req.name, "name"),
        "queue": text_value(req.queue, "queue"),
        "input": json_text(req.input, "input"),
        "key": text_value(req.idempotency_key, "idempotency_key"),
        "tenant": text_value(req.tenant_id, "tenant_id"),
        "max_attempts": req.max_attempts,
        "debounce_ms": req.debounce_ms,
        "debounce_max_ms": req.debounce_max_ms,
        "traceparent": text_value(req.traceparent, "traceparent"),
        "enqueued_by": text_value(req.enqueued_by, "enqueued_by"),
        "priority": req.priority,
    }


def job_info(row: Row, steps: Sequence[StepRecord] = ()) -> JobInfo:
    """Answer a ``job_get``/``list_*`` row as a :class:`JobInfo` (``attempt`` = spent attempts)."""
    return JobInfo(
        id=row[0],
        run_id=row[1],
        name=row[2],
        queue=row[3],
        state=JobState(row[4]),
        attempt=row[5],
        max_attempts=row[6],
        claim=row[7],
        tenant_id=row[8],
        idempotency_key=row[9],
        input=row[10],
        run_at=utc(row[11]),
        created_at=utc(row[12]),
        updated_at=utc(row[13]),
        claimed_by=row[14],
        last_error=row[15],
        last_error_code=row[16],
        last_error_stack=row[17],
        result=row[18],
        progress=row[19],
        enqueued_by=row[20],
        traceparent=row[21],
        steps=tuple(steps),
        priority=row[22],
        parent_run_id=row[23] if len(row) > 23 else None,
    )


def step_record(row: Row) -> StepRecord:
    """Answer a ``steps_load`` row as a :class:`StepRecord`."""
    return StepRecord(
        name=row[0],
        status=row[1],
        output=row[2],
        seq=row[3],
        started_at=None if row[4] is None else utc(row[4]),
        completed_at=None if row[5] is None else utc(row[5]),
        wake_at=None if row[6] is None else utc(row[6]),
        event=row[7],
        match=row[8],
        attempts=row[9],
        error=row[10],
        once=row[11],
    )


def cursor(created_at: datetime, job_id: UUID) -> str:
    """Encode a listing position ``(created_at, id)`` as an opaque cursor."""
    micros = (created_at - _EPOCH) // _ONE_US
    raw = f"pg1|{micros}|{job_id.hex}"
    return base64.urlsafe_b64encode(raw.encode("ascii")).decode("ascii").rstrip("=")


def cursor_position(value: str) -> tuple[datetime, UUID]:
    """Decode a cursor from :func:`cursor`.

    Raises:
        JobPageInvalidError: ``X_JOB_PAGE_INVALID`` for anything this driver did not issue.
    """
    try:
        padded = value + "=" * (-len(value) % 4)
        raw = base64.b64decode(padded, altchars=b"-_", validate=True).decode("ascii")
        found = _CURSOR.fullmatch(raw)
        if found is None:
            raise ValueError("not a postgresql-driver cursor")
        return (_EPOCH + timedelta(microseconds=int(found[1])), UUID(hex=found[2]))
    except (ValueError, OverflowError) as exc:
        raise JobPageInvalidError(
            "the cursor was not issued by this listing; pass back a page's next or prev",
            driver="postgresql",
        ) from exc
