"""Step records and row hashes as Redis holds them: JSON text and flat field/value replies."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from jobs_core.types import StepRecord
from jobs_redis._codec import from_us, to_us


def pairs(flat: Sequence[str]) -> dict[str, str]:
    """Answer a flat ``[field, value, ...]`` reply as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def record_text(record: StepRecord, output: str, match: str | None) -> str:
    """Answer a step record as JSON text; ``output``/``match`` are already checked JSON text."""

    def us(at: datetime | None, what: str) -> int | None:
        return None if at is None else to_us(at, what)

    meta = json.dumps(
        {
            "status": record.status,
            "started_at": us(record.started_at, "started_at"),
            "completed_at": us(record.completed_at, "completed_at"),
            "wake_at": us(record.wake_at, "wake_at"),
            "event": record.event,
            "attempts": record.attempts,
            "error": record.error,
            "once": record.once,
        }
    )
    return f'{meta[:-1]}, "output": {output}, "match": {match or "null"}}}'


def decode_record(name: str, text: str, seq: int) -> StepRecord:
    """Decode a record written by :func:`record_text`."""
    raw = json.loads(text)

    def at(key: str) -> datetime | None:
        return None if raw[key] is None else from_us(raw[key])

    return StepRecord(
        name=name,
        status=raw["status"],
        output=raw["output"],
        seq=seq,
        started_at=at("started_at"),
        completed_at=at("completed_at"),
        wake_at=at("wake_at"),
        event=raw["event"],
        match=raw["match"],
        attempts=raw["attempts"],
        error=raw["error"],
        once=raw["once"],
    )


def decode_steps(fields: dict[str, str]) -> list[StepRecord]:
    """Decode a steps hash (``r:<name>`` records and ``q:<name>`` seqs) in ``seq`` order."""
    records = [
        decode_record(field[2:], text, int(fields["q:" + field[2:]]))
        for field, text in fields.items()
        if field.startswith("r:")
    ]
    return sorted(records, key=lambda r: r.seq)
