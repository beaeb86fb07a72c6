"""The jobs list's filters as URL query fields: parsed, validated and written back into links.

A listing URL carries its filter and cursor in the query string (``/jobs?state=dead&queue=billing
&after=...``), so a page is shareable and the browser's back button works. Bulk forms repeat the
same fields as hidden inputs, so "everything matching the filter" means what the page showed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import urlencode

from jobs_core.errors import DriverRequestInvalidError
from jobs_core.introspect import JobQuery
from jobs_core.types import MAX_JOB_PAGE, JobState

FILTER_FIELDS = ("state", "queue", "name", "tenant", "id_prefix", "created_from", "created_to")
"""The filter fields of a listing URL, in the order links write them."""

DEFAULT_LIMIT = 50
"""Rows a list page shows unless ``limit`` says otherwise."""


def _instant(text: str, field_name: str) -> datetime:
    """Parse an ISO 8601 instant; one without an offset is read as UTC.

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` naming the field.
    """
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise DriverRequestInvalidError(
            f"{field_name} must be an ISO 8601 instant such as 2026-11-01T09:30, got {text!r}",
            field=field_name,
        ) from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class ListQuery:
    """One listing request: the filter fields as given (text) and the paging.

    Attributes:
        fields: the non-empty filter fields, by name (see :data:`FILTER_FIELDS`).
        limit: rows per page (1..200).
        after: a ``next`` cursor.
        before: a ``prev`` cursor.
    """

    fields: Mapping[str, str] = field(default_factory=dict)
    limit: int = DEFAULT_LIMIT
    after: str | None = None
    before: str | None = None

    @classmethod
    def parse(cls, params: Mapping[str, str], **fixed: str) -> ListQuery:
        """Read a query string's (or a form's) fields; ``fixed`` fields override them.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a limit that is not a
                number in 1..200.
        """
        fields = {
            name: value.strip()
            for name in FILTER_FIELDS
            if (value := fixed.get(name, params.get(name, ""))) and value.strip()
        }
        text = params.get("limit", "") or str(DEFAULT_LIMIT)
        if not text.isdigit() or not 1 <= int(text) <= MAX_JOB_PAGE:
            raise DriverRequestInvalidError(
                f"limit must be a number from 1 to {MAX_JOB_PAGE}, got {text!r}", field="limit"
            )
        return cls(
            fields=fields,
            limit=int(text),
            after=params.get("after") or None,
            before=params.get("before") or None,
        )

    def job_query(self) -> JobQuery:
        """Answer the :class:`~jobs_core.introspect.JobQuery` of the filter fields.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an unknown state or a
                malformed instant.
        """
        query: JobQuery = {}
        f = self.fields
        if "state" in f:
            try:
                query["state"] = JobState(f["state"])
            except ValueError:
                raise DriverRequestInvalidError(
                    f"state must be one of {', '.join(s.value for s in JobState)}, "
                    f"got {f['state']!r}",
                    field="state",
                ) from None
        for name, key in (("queue", "queue"), ("name", "name"), ("tenant", "tenant_id")):
            if name in f:
                query[key] = f[name]  # type: ignore[literal-required]
        if "id_prefix" in f:
            query["id_prefix"] = f["id_prefix"].lower()
        if "created_from" in f:
            query["created_from"] = _instant(f["created_from"], "created_from")
        if "created_to" in f:
            query["created_to"] = _instant(f["created_to"], "created_to")
        return query

    def href(self, path: str, **paging: str | None) -> str:
        """Answer ``path`` with this filter, the limit and ``paging`` (``after``/``before``)."""
        params = [(name, self.fields[name]) for name in FILTER_FIELDS if name in self.fields]
        if self.limit != DEFAULT_LIMIT:
            params.append(("limit", str(self.limit)))
        params += [(k, v) for k, v in paging.items() if v]
        return f"{path}?{urlencode(params)}" if params else path
