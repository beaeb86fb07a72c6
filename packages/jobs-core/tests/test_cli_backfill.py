"""``jobsctl backfill``: the dry run, --write, --all past a failure, --pending as a deploy gate."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from jobs_core import REGISTRY, BackfillJob, backfill
from jobs_core.cli import create_app
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.testing import run_jobs, use_driver


def _pages(cursor: Any, cancel: Any, input: Any) -> tuple[list[int], int | None]:
    start = cursor or 0
    return list(range(start, min(start + 10, 25))), (start + 10 if start + 10 < 25 else None)


@pytest.fixture
def declared() -> Iterator[dict[str, BackfillJob]]:
    """Three backfills in the process-wide registry (what --app modules would declare)."""
    priced: list[int] = []
    made = {
        "slugs": backfill(
            name="cli.slugs", tenant="none", pages=_pages, handle=lambda r, c: None, rate=500
        ),
        "blocked": backfill(
            name="cli.blocked",
            tenant="none",
            pages=_pages,
            handle=lambda r, c: None,
            requires="2026_09_01_add_column",
            migrations=lambda: [],
        ),
        "prices": backfill(
            name="cli.prices",
            tenant="none",
            pages=_pages,
            handle=lambda rows, cancel: priced.extend(rows),
            count=lambda ctx: 25 - len(priced),
            rate=500,
        ),
    }
    yield made
    for handle in made.values():
        REGISTRY.unregister(handle.name)


def invoke(driver: MemoryDriver, *args: str) -> Any:
    return CliRunner().invoke(create_app(plugins=False, driver=driver), list(args))


async def _drain(driver: MemoryDriver) -> None:
    with use_driver(driver):
        await run_jobs(driver, timeout="20s")


def test_a_dry_run_shows_the_plan_and_writes_nothing(declared: dict[str, BackfillJob]) -> None:
    mem = MemoryDriver()
    done = invoke(mem, "backfill", "cli.prices", "--json")
    assert done.exit_code == 0, done.output
    plan = json.loads(done.output)
    assert (plan["count"], plan["pages"], plan["batch"], plan["would"]) == (25, 1, 1000, "run")
    assert plan["latest"] is None and len(plan["checksum"]) == 64
    people = invoke(mem, "backfill", "cli.blocked")
    assert people.exit_code == 0
    assert "X_BACKFILL_MIGRATION_PENDING" in people.output and "2026_09_01" in people.output
    assert asyncio.run(mem.stats()) == []
    unknown = invoke(mem, "backfill", "cli.nope")
    assert unknown.exit_code == 2 and "cli.slugs" in unknown.output


def test_pending_exits_1_then_0_after_the_passes_and_all_continues_past_a_failure(
    declared: dict[str, BackfillJob],
) -> None:
    mem = MemoryDriver()
    gate = invoke(mem, "backfill", "--pending", "--json")
    assert gate.exit_code == 1
    assert json.loads(gate.output) == {
        "pending": ["cli.blocked", "cli.prices", "cli.slugs"],
        "scoped": [],
    }
    every = invoke(mem, "backfill", "--all", "--write", "--json")
    assert every.exit_code == 1, "one name failed"
    outcomes = {o["name"]: o for o in json.loads(every.output)}
    assert outcomes["cli.blocked"]["ok"] is False
    assert outcomes["cli.blocked"]["code"] == "X_BACKFILL_MIGRATION_PENDING"
    assert outcomes["cli.prices"]["ok"] and outcomes["cli.slugs"]["ok"], "past the failure"
    asyncio.run(_drain(mem))
    gate = invoke(mem, "backfill", "--pending")
    assert gate.exit_code == 1 and "pending: cli.blocked" in gate.output
    REGISTRY.unregister("cli.blocked")
    assert invoke(mem, "backfill", "--pending").exit_code == 0
    again = invoke(mem, "backfill", "cli.slugs", "--write", "--json")
    assert again.exit_code == 0 and json.loads(again.output)["deduped"] is False
    shown = invoke(mem, "show", outcomes["cli.slugs"]["id"])
    assert shown.exit_code == 0
    assert '"done": ' in shown.output and "cursor" in shown.output, shown.output


def test_write_refused_exits_2_with_the_code_and_its_fix(declared: dict[str, BackfillJob]) -> None:
    mem = MemoryDriver()
    done = invoke(mem, "backfill", "cli.blocked", "--write")
    assert done.exit_code == 2
    assert "X_BACKFILL_MIGRATION_PENDING" in done.output and "fix:" in done.output
    assert invoke(mem, "backfill").exit_code == 2, "a NAME, --all or --pending is needed"


def test_the_manifest_lists_the_core_factories() -> None:
    done = CliRunner().invoke(create_app(plugins=False), ["manifest", "--json"])
    assert done.exit_code == 0, done.output
    factories = {
        (e["name"], e["value"], e["distribution"])
        for e in json.loads(done.output)
        if e["kind"] == "factory"
    }
    assert {
        ("backfill", "jobs_core:backfill", "jobs-core"),
        ("purge", "jobs_core:purge", "jobs-core"),
        ("consumer", "jobs_core:consumer", "jobs-core"),
    } <= factories
