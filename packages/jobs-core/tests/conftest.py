"""Shared fixtures: a manual clock, a memory driver on it, and a private job registry.

This conftest also opts the memory driver into the jobs-conformance suite: the suite's modules
are collected here (``-m conformance`` selects them, ``-m "not conformance"`` leaves them out).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest

from jobs_core import Clock, JobRegistry, use_driver
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.testing import ManualClock

pytest_plugins = ["jobs_conformance.plugin"]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def driver(clock: ManualClock) -> AsyncIterator[MemoryDriver]:
    mem = MemoryDriver(clock=clock)
    with use_driver(mem):
        yield mem
    await mem.close()


@pytest.fixture
def registry() -> Iterator[JobRegistry]:
    yield JobRegistry()


@pytest.fixture
def driver_factory() -> Callable[..., Awaitable[MemoryDriver]]:
    """The conformance suite's driver: one memory driver per test, on the suite's clock.

    Every call answers the same driver (it is the backend, and it is safe to share between
    threads), so drivers the suite opens on other threads see the same rows.
    """
    opened: list[MemoryDriver] = []

    async def open_memory(*, clock: Clock | None = None) -> MemoryDriver:
        if not opened:
            opened.append(MemoryDriver(clock))
        return opened[0]

    return open_memory
