"""The backfill ledger (where declared): one row per pass, idempotent begin, final completion."""

from __future__ import annotations

import pytest

from jobs_conformance.target import Target
from jobs_core.driver import BackfillLedger
from jobs_core.errors import JobsError
from jobs_core.ids import new_id
from jobs_core.types import BackfillProgress, BackfillQuery, BackfillStart


def _ledger(target: Target) -> BackfillLedger:
    ledger: BackfillLedger = target.require("backfills")
    return ledger


async def test_begin_opens_a_running_pass_and_is_idempotent_by_id(target: Target) -> None:
    """Beginning a pass twice (a replay after a crash) answers the first row unchanged."""
    ledger = _ledger(target)
    pass_id = new_id()
    first = await ledger.begin(BackfillStart(pass_id, "slugs", "", "c1", "build-7"))
    assert (first.id, first.name, first.scope, first.checksum) == (pass_id, "slugs", "", "c1")
    assert (first.status, first.rows, first.last_cursor) == ("running", 0, None)
    assert first.app_version == "build-7" and first.completed_at is None
    assert await ledger.record(BackfillProgress(pass_id, 1_000, [1000]))
    again = await ledger.begin(BackfillStart(pass_id, "slugs", "", "c2", "build-8"))
    assert (again.checksum, again.rows, again.last_cursor) == ("c1", 1_000, [1000])
    assert again.started_at == first.started_at


async def test_a_completed_pass_is_final_and_found_by_name_and_scope(target: Target) -> None:
    """Completion stamps completed_at; later records and settles change nothing."""
    ledger = _ledger(target)
    pass_id = new_id()
    await ledger.begin(BackfillStart(pass_id, "slugs", "acme", "c1"))
    assert await ledger.completed("slugs", "acme") is None
    assert await ledger.record(BackfillProgress(pass_id, 5, {"after": "k5"}))
    assert await ledger.settle(pass_id, "completed")
    done = await ledger.completed("slugs", "acme")
    assert done is not None and done.id == pass_id
    assert (done.status, done.rows, done.last_cursor) == ("completed", 5, {"after": "k5"})
    assert done.completed_at is not None and done.completed_at >= done.started_at
    assert not await ledger.record(BackfillProgress(pass_id, 9, None))
    assert not await ledger.settle(pass_id, "failed")
    assert await ledger.completed("slugs", "") is None, "another scope"
    assert await ledger.completed("other", "acme") is None, "another backfill"
    assert not await ledger.record(BackfillProgress(new_id(), 1, None)), "an unknown pass"


async def test_a_failed_pass_resumes_running(target: Target) -> None:
    """A failed pass (its job dead-lettered) that records again (a requeue) runs again."""
    ledger = _ledger(target)
    pass_id = new_id()
    await ledger.begin(BackfillStart(pass_id, "slugs", "", "c1"))
    assert await ledger.settle(pass_id, "failed")
    [failed] = await ledger.passes(BackfillQuery(name="slugs"))
    assert failed.status == "failed" and failed.completed_at is None
    assert await ledger.completed("slugs", "") is None
    assert await ledger.record(BackfillProgress(pass_id, 7, [7]))
    [running] = await ledger.passes(BackfillQuery(name="slugs"))
    assert (running.status, running.rows) == ("running", 7)


async def test_passes_are_newest_first_and_filtered(target: Target) -> None:
    """Each pass is its own row; forced passes after a completed one are more rows."""
    ledger = _ledger(target)
    ids = []
    for scope in ("", "", "acme"):
        pass_id = new_id()
        ids.append(pass_id)
        await ledger.begin(BackfillStart(pass_id, "slugs", scope, "c1"))
        await ledger.settle(pass_id, "completed")
        await target.advance(20)
    await ledger.begin(BackfillStart(new_id(), "other", "", "c1"))
    every = await ledger.passes(BackfillQuery(name="slugs"))
    assert [p.id for p in every] == list(reversed(ids))
    unscoped = await ledger.passes(BackfillQuery(name="slugs", scope=""))
    assert [p.id for p in unscoped] == [ids[1], ids[0]]
    newest = await ledger.completed("slugs", "")
    assert newest is not None and newest.id == ids[1]
    assert len(await ledger.passes(BackfillQuery())) == 4
    assert len(await ledger.passes(BackfillQuery(limit=2))) == 2


async def test_bad_ledger_calls_are_refused(target: Target) -> None:
    """Bad calls are refused before anything is written.

    An empty name or checksum, a bad status, a limit outside 1..1,000, a cursor that is not JSON.
    """
    ledger = _ledger(target)
    for start in (BackfillStart(new_id(), "", "", "c"), BackfillStart(new_id(), "n", "", "")):
        with pytest.raises(JobsError):
            await ledger.begin(start)
    pass_id = new_id()
    await ledger.begin(BackfillStart(pass_id, "n", "", "c"))
    with pytest.raises(JobsError):
        await ledger.settle(pass_id, "running")
    with pytest.raises(JobsError):
        await ledger.record(BackfillProgress(pass_id, 1, {"bad": object()}))
    for limit in (0, 1_001):
        with pytest.raises(JobsError):
            await ledger.passes(BackfillQuery(limit=limit))
    assert (await ledger.passes(BackfillQuery(name="n")))[0].rows == 0
