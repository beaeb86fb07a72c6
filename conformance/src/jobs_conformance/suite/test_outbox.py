"""Outbox (where declared): staged rows commit with their transaction; claims are fenced."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from jobs_conformance.target import Target, request, state_counts
from jobs_core.driver import LeaderLease, OutboxStageMany, OutboxStore
from jobs_core.outbox import Relay
from jobs_core.types import OutboxClaim


async def _stage_all(store: OutboxStore, reqs: Any, tx: Any) -> None:
    """Stage ``reqs`` with ``stage_many`` when the store has it (optional), else one by one."""
    if isinstance(store, OutboxStageMany):
        await store.stage_many(reqs, tx)
    else:
        for req in reqs:
            await store.stage(req, tx)


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
        await _stage_all(store, later, tx)
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
        await _stage_all(store, reqs, tx)
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
    """Held rows block the rows staged after them; once the lease lapses one relay takes all."""
    store = _outbox(target, outbox_transaction)
    assert outbox_transaction is not None
    reqs = [request(k) for k in "abc"]
    async with outbox_transaction() as tx:
        await _stage_all(store, reqs, tx)
    taken = await store.claim(OutboxClaim("r1", 2, 300))
    assert [row.request.id for row in taken] == [reqs[0].id, reqs[1].id]
    assert await store.claim(OutboxClaim("r2", 5, 300)) == [], "c would overtake a and b"
    await target.advance(500)
    retaken = await store.claim(OutboxClaim("r3", 5, 300))
    assert [row.request.id for row in retaken] == [r.id for r in reqs]
    assert await store.mark_published([reqs[0].id], taken[0].token) == 0


async def test_order_keys_are_lanes_that_relays_share(
    target: Target, outbox_transaction: Callable[[], Any] | None
) -> None:
    """A held row blocks only its own lane: relays side by side keep the order per key."""
    store = _outbox(target, outbox_transaction)
    assert outbox_transaction is not None
    a1, b1, a2, b2, free = (
        replace(request(key), order_key=lane)
        for key, lane in (("a1", "A"), ("b1", "B"), ("a2", "A"), ("b2", "B"), ("n1", None))
    )
    async with outbox_transaction() as tx:
        for req in (a1, b1, a2, b2, free):
            await store.stage(req, tx)
            await target.advance(2)
    first = await store.claim(OutboxClaim("r1", 1, 30_000))
    assert [row.request.id for row in first] == [a1.id]
    assert first[0].request.order_key == "A"
    second = await store.claim(OutboxClaim("r2", 10, 30_000))
    assert [row.request.id for row in second] == [b1.id, b2.id, free.id], "A waits for a1"
    assert [row.request.order_key for row in second] == ["B", "B", None]
    assert await store.claim(OutboxClaim("r3", 10, 30_000)) == []
    assert await store.mark_published([a1.id], first[0].token) == 1
    third = await store.claim(OutboxClaim("r3", 10, 30_000))
    assert [row.request.id for row in third] == [a2.id]


async def test_the_relay_lease_has_one_holder_until_it_lapses(
    target: Target, outbox_transaction: Callable[[], Any] | None
) -> None:
    """One relay at a time publishes; a second takes over only when the first's lease lapses."""
    store = _outbox(target, outbox_transaction)
    lease = getattr(store, "relay_lease", None)
    if not isinstance(lease, LeaderLease):
        pytest.skip(f"NOT APPLICABLE: the {target.driver.name} outbox carries no relay lease")
    assert await lease.acquire("relay-a", 300)
    assert not await lease.acquire("relay-b", 300)
    assert await lease.acquire("relay-a", 300), "the holder renews"
    assert await lease.holder() == "relay-a"
    await lease.release("relay-b")
    assert await lease.holder() == "relay-a", "only the holder releases"
    await target.advance(500)
    assert await lease.holder() is None
    assert await lease.acquire("relay-b", 300)
    await lease.release("relay-b")
    assert await lease.acquire("relay-a", 300), "a released lease is free at once"


class _Publishes:
    """The target's driver, recording each publish call's job ids (one list per call)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[list[Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def enqueue(self, req: Any) -> Any:
        self.calls.append([req.id])
        return await self.inner.enqueue(req)

    async def enqueue_many(self, reqs: Any) -> Any:
        self.calls.append([req.id for req in reqs])
        return await self.inner.enqueue_many(reqs)


async def test_a_relay_after_a_crash_publishes_the_dead_relays_rows_first(
    target: Target, outbox_transaction: Callable[[], Any] | None
) -> None:
    """A relay killed holding rows: its successor waits for the lease, then publishes from them.

    In the field a restarted relay skipped the rows still leased to the dead one and published
    later rows first ("K:126 after K:1000"). The batch goes in one ``enqueue_many``.
    """
    store = _outbox(target, outbox_transaction)
    assert outbox_transaction is not None
    reqs = [request(f"k{i}") for i in range(6)]
    async with outbox_transaction() as tx:
        await _stage_all(store, reqs, tx)
    dead = await store.claim(OutboxClaim("killed-relay", 3, 300))
    assert len(dead) == 3
    driver = _Publishes(target.driver)
    successor = Relay(store, driver, batch=10, claim_lease="300ms", exclusive=False)
    assert await successor.run_once() == 0
    assert driver.calls == []
    await target.advance(500)
    assert await successor.run_once() == 6
    assert driver.calls == [[r.id for r in reqs]], "one publish, in staging order"
    assert await successor.run_once() == 0
    assert state_counts(await target.driver.stats()) == {"ready": 6}


async def test_a_staged_row_keeps_its_priority(
    target: Target, outbox_transaction: Callable[[], Any] | None
) -> None:
    """A claimed outbox row answers the priority it was staged with (issue 24)."""
    store = _outbox(target, outbox_transaction)
    assert outbox_transaction is not None
    async with outbox_transaction() as tx:
        await _stage_all(store, [request("p", priority=-4), request("q")], tx)
    claimed = await store.claim(OutboxClaim("r1", 10, 30_000))
    assert [(row.request.idempotency_key, row.request.priority) for row in claimed] == [
        ("p", -4),
        ("q", 0),
    ]
