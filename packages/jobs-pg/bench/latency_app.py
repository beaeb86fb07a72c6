"""The probe job the pickup-latency benchmark's worker subprocess runs.

The body's first act is to record how long ago (wall clock, one machine) the enqueuer stamped
the probe, in ``$PG_LATENCY_LOG`` (one line per probe).
"""

from __future__ import annotations

import os
import time
from typing import Any

from pydantic import BaseModel

from jobs_core import job


class Probe(BaseModel):
    """One probe: its number and the wall-clock instant its enqueue began (s)."""

    n: int
    stamped: float


@job(input=Probe, idempotency_key=lambda p: f"probe:{p.n}", tenant="none", queue="probe")
async def probe(input: Probe, step: Any, ctx: Any) -> None:
    """Record the pickup latency of this probe, in milliseconds."""
    latency_ms = (time.time() - input.stamped) * 1000
    # One O_APPEND write: no file object, nothing buffered, nothing that blocks the loop.
    fd = os.open(os.environ["PG_LATENCY_LOG"], os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, f"{input.n} {latency_ms:.3f}\n".encode())
    finally:
        os.close(fd)
