"""The seed's supporting constants: exported from ``jobs_core`` with the seed's values, and used."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel

import jobs_core
from jobs_core import (
    COUNTER_TIERS,
    DEFAULT_EVENT_POLL_MS,
    MAX_COUNTER_ROWS,
    MAX_WORKER_IN_FLIGHT,
    ON_SETTLED_TIMEOUT_MS,
    PROGRESS_INTERVAL_MS,
    WAKING_EVENT_POLL_MS,
    JobRegistry,
    job,
)
from jobs_core.drivers import memory


class Item(BaseModel):
    key: str


def test_the_constants_carry_the_seeds_values() -> None:
    assert ON_SETTLED_TIMEOUT_MS == 30_000
    assert PROGRESS_INTERVAL_MS == 1_000
    assert MAX_WORKER_IN_FLIGHT == 100
    assert DEFAULT_EVENT_POLL_MS == 30_000
    assert WAKING_EVENT_POLL_MS == 15 * 60_000
    assert [(t.tier, t.width_ms, t.kept_ms) for t in COUNTER_TIERS] == [
        ("1m", 60_000, 24 * 3_600_000),
        ("5m", 300_000, 7 * 24 * 3_600_000),
        ("1h", 3_600_000, 30 * 24 * 3_600_000),
    ]
    assert MAX_COUNTER_ROWS == 4_176
    for name in (
        "ON_SETTLED_TIMEOUT_MS",
        "PROGRESS_INTERVAL_MS",
        "MAX_WORKER_IN_FLIGHT",
        "COUNTER_TIERS",
        "DEFAULT_EVENT_POLL_MS",
        "WAKING_EVENT_POLL_MS",
    ):
        assert name in jobs_core.__all__


def test_a_job_without_on_settled_timeout_gets_the_constant(registry: JobRegistry) -> None:
    @job(input=Item, idempotency_key=lambda i: i.key, tenant="none", registry=registry)
    async def plain(input: Item, step: Any, ctx: Any) -> None:
        """Never run."""

    assert plain.on_settled_timeout_ms == ON_SETTLED_TIMEOUT_MS


def test_the_memory_counters_fold_by_the_tiers() -> None:
    tiers = {t.tier: t for t in COUNTER_TIERS}
    widths = {k: timedelta(milliseconds=t.width_ms) for k, t in tiers.items()}
    kept = {k: timedelta(milliseconds=t.kept_ms) for k, t in tiers.items()}
    assert (widths, kept) == (memory._TIER_WIDTH, memory._TIER_KEPT)
    assert memory._TIER_PARENT == {"1m": "5m", "5m": "1h", "1h": None}
