"""Leases (where declared): slots up to a limit, holders in slot order, renewal, TTL expiry."""

from __future__ import annotations

import pytest

from jobs_conformance.target import Target
from jobs_core.driver import LeaseRequest, LeaseStore
from jobs_core.errors import JobsError


def _leases(target: Target) -> LeaseStore:
    store: LeaseStore = target.require("leases")
    return store


async def test_slots_fill_up_to_the_limit_in_order(target: Target) -> None:
    """A key admits ``limit`` holders, listed in the order they took their slots."""
    leases = _leases(target)
    for holder in ("h1", "h2"):
        assert await leases.acquire(LeaseRequest("job:a", 2, holder, 60_000))
    assert not await leases.acquire(LeaseRequest("job:a", 2, "h3", 60_000))
    assert await leases.acquire(LeaseRequest("job:a", 2, "h1", 60_000)), "a holder renews"
    assert await leases.holders("job:a") == ["h1", "h2"]
    assert await leases.holders("job:other") == []
    await leases.release("job:a", "h1")
    await leases.release("job:a", "nobody")
    assert await leases.holders("job:a") == ["h2"]
    assert await leases.acquire(LeaseRequest("job:a", 2, "h3", 60_000))
    assert await leases.holders("job:a") == ["h2", "h3"]


async def test_slots_expire_after_their_ttl_unless_renewed(target: Target) -> None:
    """A slot lapses ``ttl_ms`` after its last acquire or renew, and frees its place."""
    leases = _leases(target)
    assert await leases.acquire(LeaseRequest("job:b", 1, "old", 400))
    assert await leases.acquire(LeaseRequest("job:b", 2, "kept", 400))
    await target.advance(250)
    assert await leases.renew(LeaseRequest("job:b", 2, "kept", 400))
    await target.advance(250)
    assert await leases.holders("job:b") == ["kept"]
    assert not await leases.renew(LeaseRequest("job:b", 2, "old", 400))
    assert await leases.acquire(LeaseRequest("job:b", 2, "new", 400))
    assert await leases.holders("job:b") == ["kept", "new"]
    await target.advance(600)
    assert await leases.holders("job:b") == []
    assert not await leases.renew(LeaseRequest("job:b", 2, "kept", 400))


async def test_bad_lease_requests_are_refused(target: Target) -> None:
    """A limit or ttl below 1 is refused."""
    leases = _leases(target)
    for req in (LeaseRequest("job:c", 0, "h", 1_000), LeaseRequest("job:c", 1, "h", 0)):
        with pytest.raises(JobsError):
            await leases.acquire(req)
    assert await leases.holders("job:c") == []
