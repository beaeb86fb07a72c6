"""How values read on a page: instants, ages, durations, sizes and JSON (Jinja2 filters)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import jinja2


def when(value: datetime | None) -> str:
    """Answer an instant as ISO 8601 UTC to the second (``""`` for ``None``)."""
    if value is None:
        return ""
    return value.isoformat(timespec="seconds").replace("+00:00", "Z")


def age_ms(ms: float | None) -> str:
    """Answer a duration in ms as a person reads it (``850ms``, ``12s``, ``3h04m``)."""
    if ms is None:
        return ""
    if ms < 1000:
        return f"{ms:.0f}ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    return f"{hours // 24}d{hours % 24:02d}h"


def between(start: datetime | None, end: datetime | None) -> str:
    """Answer the duration from ``start`` to ``end`` (``""`` unless both are known)."""
    if start is None or end is None:
        return ""
    return age_ms((end - start) / timedelta(milliseconds=1))


def size(value: Any) -> str:
    """Answer the size of a value's JSON text (``""`` for ``None``)."""
    if value is None:
        return ""
    n = len(json.dumps(value, separators=(",", ":"), default=str).encode())
    if n < 1024:
        return f"{n} B"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n / 1024 / 1024:.1f} MiB"


def pretty(value: Any) -> str:
    """Answer a JSON value indented for a ``<pre>`` (escaped by the template, like any text)."""
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)


def install(env: jinja2.Environment) -> None:
    """Register the filters on ``env``."""
    env.filters.update(when=when, age_ms=age_ms, between=between, size=size, pretty=pretty)
