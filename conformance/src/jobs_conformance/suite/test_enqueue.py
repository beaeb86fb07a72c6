"""Enqueue: ids, run ids, dedupe of live keys, explicit ids, batches, due instants, NUL refusal."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from jobs_conformance.target import Target, claim, request, state_counts
from jobs_core import JobRegistry, job, use_driver
from jobs_core.errors import (
    IdempotencyRequiredError,
    JobDuplicateError,
    JobInputInvalidError,
    JobOptionsInvalidError,
    JobRunIdTakenError,
    JobsError,
)
from jobs_core.ids import new_id
from jobs_core.types import Fence, NackOptions, Settle, StepRecord, StepWrite


class _Note(BaseModel):
    key: str
    text: str = ""


def _note_job(name: str, key: Callable[[_Note], str] | None = None) -> Any:
    """Declare a job the tests only enqueue (its body never runs), in a registry of its own."""

    async def body(input: _Note, step: object, ctx: object) -> None:
        """Never run: the tests only enqueue."""

    return job(
        input=_Note,
        idempotency_key=key or (lambda n: n.key),
        tenant="none",
        name=name,
        registry=JobRegistry(),
    )(body)


async def test_enqueue_answers_the_requested_ids(target: Target) -> None:
    """A new row answers the request's id and run id, not deduped."""
    req = request("a")
    result = await target.driver.enqueue(req)
    assert (result.id, result.run_id, result.deduped) == (req.id, req.run_id, False)
    [claimed] = await claim(target.driver)
    assert (claimed.id, claimed.run_id) == (req.id, req.run_id)
    assert claimed.input == {"key": "a"}
    assert (claimed.name, claimed.queue, claimed.tenant_id) == ("conformance.job", "default", "t1")
    assert claimed.idempotency_key == "a"
    assert claimed.max_attempts == 3
    assert claimed.traceparent == req.traceparent
    assert claimed.enqueued_by == "conformance"


async def test_a_live_key_dedupes_to_the_live_row(target: Target) -> None:
    """While a row is live, the same (name, tenant, key) answers it and inserts nothing."""
    first = await target.driver.enqueue(request("a"))
    again = await target.driver.enqueue(request("a"))
    assert (again.id, again.run_id, again.deduped) == (first.id, first.run_id, True)
    [held] = await claim(target.driver)
    running = await target.driver.enqueue(request("a"))
    assert (running.id, running.deduped) == (first.id, True)
    assert state_counts(await target.driver.stats()) == {"running": 1}
    assert await target.driver.ack(held.id, Settle(held.fence))
    tomorrow = await target.driver.enqueue(request("a"))
    assert not tomorrow.deduped
    assert tomorrow.id != first.id
    assert state_counts(await target.driver.stats()) == {"ready": 1, "done": 1}


async def test_dedupe_key_includes_name_and_tenant(target: Target) -> None:
    """Two names, or two tenants, with one key are separate rows; no tenant is its own key."""
    results = [
        await target.driver.enqueue(request("k", name="conformance.a", tenant="t1")),
        await target.driver.enqueue(request("k", name="conformance.b", tenant="t1")),
        await target.driver.enqueue(request("k", name="conformance.a", tenant="t2")),
        await target.driver.enqueue(request("k", name="conformance.a", tenant=None)),
    ]
    assert [r.deduped for r in results] == [False] * 4
    assert len({r.id for r in results}) == 4
    again = await target.driver.enqueue(request("k", name="conformance.a", tenant="t2"))
    assert (again.id, again.deduped) == (results[2].id, True)
    untenanted = await target.driver.enqueue(request("k", name="conformance.a", tenant=None))
    assert (untenanted.id, untenanted.deduped) == (results[3].id, True)
    assert state_counts(await target.driver.stats()) == {"ready": 4}


async def test_dead_and_failed_rows_free_their_key_a_retry_keeps_it(target: Target) -> None:
    """A row nacked to retry stays live (dedupes); one settled dead or failed frees its key."""
    driver = target.driver
    for key, dead in (("dead", True), ("failed", False)):
        first = await driver.enqueue(request(key))
        [held] = await claim(driver)
        assert await driver.nack(held.id, NackOptions(held.fence, delay_ms=0))
        retried = await driver.enqueue(request(key))
        assert (retried.id, retried.deduped) == (first.id, True)
        [held] = await claim(driver)
        assert await driver.nack(held.id, NackOptions(held.fence, dead_letter=dead, fail=not dead))
        fresh = await driver.enqueue(request(key))
        assert not fresh.deduped and fresh.id != first.id
        [held] = await claim(driver)
        assert await driver.ack(held.id, Settle(held.fence))


async def test_an_explicit_id_meets_its_row_live_or_finished(target: Target) -> None:
    """An id that names a row answers that row, even under another key, and inserts nothing."""
    driver = target.driver
    first = request("a")
    await driver.enqueue(first)
    replay = request("other-key", job_id=first.id)
    live = await driver.enqueue(replay)
    assert (live.id, live.run_id, live.deduped) == (first.id, first.run_id, True)
    [held] = await claim(driver)
    assert held.input == {"key": "a"}
    assert await driver.ack(held.id, Settle(held.fence))
    finished = await driver.enqueue(request("a", job_id=first.id))
    assert (finished.id, finished.run_id, finished.deduped) == (first.id, first.run_id, True)
    assert state_counts(await driver.stats()) == {"done": 1}
    assert await claim(driver) == []


async def test_a_run_id_belongs_to_one_job(target: Target) -> None:
    """A new job naming a run id another job holds or held is refused, naming that job.

    Steps are keyed by run id: a new job on an old run would answer the old run's step outputs
    (a new checkout answered with the old charge, never charging). A re-publish of the same job
    id is not a reuse, and a batch with a refused request queues nothing.
    """
    driver = target.driver
    old = request("checkout-1")
    await driver.enqueue(old)
    [held] = await claim(driver)
    charged = StepRecord("charge", "completed", output={"charge": "ch_1"})
    assert await driver.steps.write(StepWrite(held.id, held.fence, held.run_id, charged))
    assert await driver.ack(held.id, Settle(held.fence))
    with pytest.raises(JobRunIdTakenError) as raised:
        await driver.enqueue(request("checkout-2", run_id=old.run_id))
    assert raised.value.code == "X_JOB_RUN_ID_TAKEN"
    assert raised.value.meta["holder"] == str(old.id)
    assert str(old.id) in str(raised.value)
    live = request("live")
    await driver.enqueue(live)
    with pytest.raises(JobRunIdTakenError) as in_batch:
        await driver.enqueue_many([request("x"), request("y", run_id=live.run_id)])
    assert in_batch.value.meta["holder"] == str(live.id)
    twin = new_id()
    with pytest.raises(JobRunIdTakenError):
        await driver.enqueue_many([request("p", run_id=twin), request("q", run_id=twin)])
    assert state_counts(await driver.stats()) == {"ready": 1, "done": 1}, (
        "a refused batch queues nothing"
    )
    again = await driver.enqueue(request("checkout-1", job_id=old.id, run_id=old.run_id))
    assert (again.id, again.run_id, again.deduped) == (old.id, old.run_id, True)
    deduped = await driver.enqueue(request("live", run_id=old.run_id))
    assert (deduped.id, deduped.deduped) == (live.id, True), "a deduped request inserts nothing"
    checkout = _note_job("conformance.checkout")
    with use_driver(driver), pytest.raises(JobRunIdTakenError):
        await checkout.enqueue(_Note(key="o-2"), run_id=old.run_id)
    assert state_counts(await driver.stats()) == {"ready": 1, "done": 1}


async def test_on_conflict_error_through_the_facade(target: Target) -> None:
    """``on_conflict="error"`` raises X_JOB_DUPLICATE and leaves the live row alone."""

    class Item(BaseModel):
        sku: str

    registry = JobRegistry()

    @job(
        input=Item,
        idempotency_key=lambda i: i.sku,
        tenant="none",
        name="conformance.facade",
        registry=registry,
    )
    async def stock(input: Item, step: object, ctx: object) -> None:
        """Never run: the test only enqueues."""

    with use_driver(target.driver):
        first = await stock.enqueue(Item(sku="s1"))
        with pytest.raises(JobDuplicateError) as raised:
            await stock.enqueue(Item(sku="s1"), on_conflict="error")
        assert raised.value.code == "X_JOB_DUPLICATE"
        assert raised.value.meta["id"] == str(first.id)
        deduped = await stock.enqueue(Item(sku="s1"))
        assert (deduped.id, deduped.deduped) == (first.id, True)
        with pytest.raises(JobOptionsInvalidError):
            await stock.enqueue_many([Item(sku="s2")], on_conflict="error")
    assert state_counts(await target.driver.stats()) == {"ready": 1}


async def test_enqueue_many_answers_in_order_and_dedupes_inside_the_batch(target: Target) -> None:
    """Answers come in input order; a repeated key answers the batch's earlier row."""
    driver = target.driver
    live = await driver.enqueue(request("live"))
    reqs = [request("a"), request("b"), request("a"), request("live"), request("c")]
    results = await driver.enqueue_many(reqs)
    assert [r.id for r in results] == [reqs[0].id, reqs[1].id, reqs[0].id, live.id, reqs[4].id]
    assert [r.run_id for r in results] == [
        reqs[0].run_id,
        reqs[1].run_id,
        reqs[0].run_id,
        live.run_id,
        reqs[4].run_id,
    ]
    assert [r.deduped for r in results] == [False, False, True, True, False]
    assert state_counts(await driver.stats()) == {"ready": 4}
    assert await driver.enqueue_many([]) == []


async def test_run_at_in_the_past_is_due_now_and_far_future_waits(target: Target) -> None:
    """A past ``run_at`` is claimable at once; a far-future one is delayed and not claimed."""
    driver = target.driver
    await driver.enqueue(request("past", run_at=datetime(2001, 1, 1, tzinfo=UTC)))
    far = datetime.now(UTC) + timedelta(days=3650)
    if target.clock is not None:
        far = target.clock.now() + timedelta(days=3650)
    await driver.enqueue(request("future", run_at=far))
    await driver.enqueue(request("delay", delay_ms=3_600_000))
    assert state_counts(await driver.stats()) == {"ready": 1, "delayed": 2}
    claimed = await claim(driver)
    assert [c.idempotency_key for c in claimed] == ["past"]
    await target.advance(1_000)
    assert await claim(driver) == []


async def test_a_delay_becomes_due_when_it_passes(target: Target) -> None:
    """A row enqueued with ``delay_ms`` is delayed, then claimable once the delay passed."""
    await target.driver.enqueue(request("later", delay_ms=300))
    assert await claim(target.driver) == []
    await target.advance(500)
    assert [c.idempotency_key for c in await claim(target.driver)] == ["later"]


async def test_nul_is_refused_before_anything_is_written(target: Target) -> None:
    """NUL (U+0000) in an input is refused by the driver, and by the facade anywhere."""
    driver = target.driver
    with pytest.raises(JobsError):
        await driver.enqueue(request("nul", payload={"text": "a\x00b"}))
    with pytest.raises(JobsError):
        await driver.enqueue_many([request("ok"), request("nul", payload=["\x00"])])
    assert state_counts(await driver.stats()) == {}
    note = _note_job("conformance.nul")
    nul_key = _note_job("conformance.nul-key", key=lambda n: f"{n.key}\x00")
    with use_driver(driver):
        with pytest.raises(JobInputInvalidError):
            await note.enqueue(_Note(key="k", text="a\x00b"))
        with pytest.raises(IdempotencyRequiredError):
            await nul_key.enqueue(_Note(key="k"))
        with pytest.raises(JobOptionsInvalidError):
            await note.enqueue(_Note(key="k"), queue="q\x00")
    assert state_counts(await driver.stats()) == {}


async def test_lone_surrogates_are_refused_alike_and_never_quoted(target: Target) -> None:
    """A lone surrogate (U+D800..U+DFFF) anywhere is refused before anything is written.

    No UTF-8 encodes one: Postgres refused it with a message quoting the payload around it, the
    memory and Redis drivers stored it (Redis as a raw ``UnicodeEncodeError`` in a key). Every
    driver now answers ``X_DRIVER_REQUEST_INVALID`` naming the field, and the facade
    ``X_JOB_INPUT_INVALID``; neither quotes a value.
    """
    driver = target.driver
    secret = "s3cr3t-payload"
    for bad, field in [
        (request("k", payload={"text": f"{secret}\ud800"}), "input"),
        (request("k", payload=[secret, "\udc00"]), "input"),
        (request(f"{secret}\ud800"), "idempotency_key"),
        (request("k", tenant=f"{secret}\udfff"), "tenant_id"),
        (request("k", queue="q\ud800"), "queue"),
    ]:
        with pytest.raises(JobsError) as raised:
            await driver.enqueue(bad)
        assert raised.value.code == "X_DRIVER_REQUEST_INVALID", field
        assert raised.value.meta.get("field") == field
        assert secret not in str(raised.value)
        with pytest.raises(JobsError):
            await driver.enqueue_many([request("ok"), bad])
    assert state_counts(await driver.stats()) == {}
    astral = await driver.enqueue(request("emoji", payload={"text": "ok \U0001f600"}))
    [claimed] = await claim(driver)
    assert (claimed.id, claimed.input) == (astral.id, {"text": "ok \U0001f600"})
    note = _note_job("conformance.surrogate")
    with use_driver(driver):
        with pytest.raises(JobInputInvalidError) as facade:
            await note.enqueue(_Note(key="k", text=f"{secret}\ud800"))
        assert facade.value.meta["path"] == "$.text"
        assert secret not in str(facade.value)
        with pytest.raises(JobInputInvalidError):
            await note.enqueue(_Note(key="k\ud800"))
    assert state_counts(await driver.stats()) == {"running": 1}


async def test_stale_fence_cannot_settle_a_row_enqueued_again(target: Target) -> None:
    """After a row finished and its key was queued again, the old claim settles nothing."""
    driver = target.driver
    await driver.enqueue(request("a"))
    [old] = await claim(driver)
    assert await driver.ack(old.id, Settle(old.fence))
    await driver.enqueue(request("a"))
    [new] = await claim(driver)
    assert not await driver.ack(old.id, Settle(old.fence))
    assert not await driver.ack(new.id, Settle(Fence("w2", new.claim)))
    assert await driver.ack(new.id, Settle(new.fence))
