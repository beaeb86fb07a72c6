"""Outbox (where declared): staged rows commit with their transaction; claims are fenced."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from jobs_conformance.target import Target, request
from jobs_core.driver import OutboxStore
from jobs_core.types import OutboxClaim


def _outbox(target: Target, outbox_transaction: Callable[[], Any] | None) -> OutboxStore:
    store: OutboxStore = target.require("outbox")
    if outbox_transaction is None:
        pytest.fail(
            f"the {target.driver.name} driver declares 'outbox': its conftest must provide the "
            "outbox_transaction fixture (see jobs_conformance.plugin)"
        )
    return store


async def test_staged_rows_are_claimed_in_order_only_once_committed(
    target: Target, outbox_transaction: Callable[[], Any] | None
) -> None:
    """Committed rows come out in staging order; rolled-back rows never do."""
    store = _outbox(target, outbox_transaction)
    assert outbox_transaction is not None
    first = [request("a"), request("b")]
    async with outbox_transaction() as tx:
        await store.stage(first[0], tx)
        await target.advance(5)
        await store.stage(first[1], tx)
        assert await store.claim(OutboxClaim("r1", 10, 30_000)) == [], "not committed yet"
    with pytest.raises(RuntimeError):
        async with outbox_transaction() as tx:
            await store.stage(request("rolled-back"), tx)
            raise RuntimeError("the business write failed")
    await target.advance(5)
    later = [request("c"), request("d")]
    async with outbox_transaction() as tx:
        await store.stage_many(later, tx)
    claimed = await store.claim(OutboxClaim("r1", 10, 30_000))
    assert [row.request.id for row in claimed] == [r.id for r in first + later]
    assert [row.request.idempotency_key for row in claimed] == ["a", "b", "c", "d"]
    assert len({row.token for row in claimed}) == 1
    assert await store.claim(OutboxClaim("r2", 10, 30_000)) == []


async def test_release_and_mark_are_fenced_on_the_claimant(
    target: Target, outbox_transaction: Callable[[], Any] | None
) -> None:
    """Only the claim's token releases or marks its rows; released rows are claimable at once."""
    store = _outbox(target, outbox_transaction)
    assert outbox_transaction is not None
    reqs = [request(k) for k in "abc"]
    async with outbox_transaction() as tx:
        await store.stage_many(reqs, tx)
    claimed = await store.claim(OutboxClaim("r1", 3, 30_000))
    token = claimed[0].token
    ids = [row.request.id for row in claimed]
    assert await store.mark_published(ids[:1], "someone-else") == 0
    await store.release(ids[1:], "someone-else")
    assert await store.claim(OutboxClaim("r2", 3, 30_000)) == []
    assert await store.mark_published(ids[:1], token) == 1
    await store.release(ids[1:], token)
    again = await store.claim(OutboxClaim("r2", 3, 30_000))
    assert [row.request.id for row in again] == ids[1:]
    assert await store.mark_published(ids[1:], token) == 0, "the old claim lost them"
    assert await store.mark_published(ids[1:], again[0].token) == 2
    assert await store.claim(OutboxClaim("r3", 3, 30_000)) == []


async def test_a_lapsed_claim_passes_to_another_relay(
    target: Target, outbox_transaction: Callable[[], Any] | None
) -> None:
    """Rows whose claim lease lapsed go to the next relay, limited and in order."""
    store = _outbox(target, outbox_transaction)
    assert outbox_transaction is not None
    reqs = [request(k) for k in "abc"]
    async with outbox_transaction() as tx:
        await store.stage_many(reqs, tx)
    taken = await store.claim(OutboxClaim("r1", 2, 300))
    assert [row.request.id for row in taken] == [reqs[0].id, reqs[1].id]
    assert [row.request.id for row in await store.claim(OutboxClaim("r2", 5, 300))] == [reqs[2].id]
    await target.advance(500)
    retaken = await store.claim(OutboxClaim("r3", 5, 300))
    assert [row.request.id for row in retaken] == [r.id for r in reqs]
    assert await store.mark_published([reqs[0].id], taken[0].token) == 0
