"""The worker app of ``bench/cluster.py``: one no-op job (``bench.cluster.noop``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from jobs_core import job


class N(BaseModel):
    """The job's input: its number (the idempotency key)."""

    n: int


@job(input=N, idempotency_key=lambda i: f"n{i.n}", tenant="none", name="bench.cluster.noop")
async def noop(input: N, step: Any, ctx: Any) -> None:
    """Do nothing."""
