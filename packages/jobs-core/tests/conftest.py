"""Shared fixtures: a manual clock, a memory driver on it, and a private job registry."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from jobs_core import JobRegistry, use_driver
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.testing import ManualClock


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
