"""Shared fixtures: a manual clock, a memory driver on it, and a private job registry.

This conftest also opts the memory driver into the jobs-conformance suite: the suite's modules
are collected here (``-m conformance`` selects them, ``-m "not conformance"`` leaves them out).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager

import pytest

from jobs_core import Clock, JobRegistry, use_driver
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.drivers.memory_outbox import MemoryTransaction
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

    open_memory.opened = opened  # type: ignore[attr-defined]
    return open_memory


@pytest.fixture
def outbox_transaction(
    driver_factory: Callable[..., Awaitable[MemoryDriver]],
) -> Callable[[], AbstractAsyncContextManager[MemoryTransaction]]:
    """The conformance suite's outbox transaction: the memory store's own, on the same driver."""

    def begin() -> AbstractAsyncContextManager[MemoryTransaction]:
        opened: list[MemoryDriver] = driver_factory.opened  # type: ignore[attr-defined]
        return opened[0].outbox.transaction()

    return begin
