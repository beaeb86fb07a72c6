"""subject_erase on real PostgreSQL: the passes, the record, targets, rounds, a second run."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel

import subject_world as world
from jobs_core import JobRegistry, JobState, Retry, use_driver
from jobs_core.errors import JobDeclarationInvalidError, JobDuplicateError
from jobs_core.faults import Boundary, install_fault_hook
from jobs_core.testing import run_jobs
from jobs_pg import PostgresDriver
from jobs_subject import (
    Treatment,
    define_subject,
    subject_erase,
    subject_erase_tables,
    subject_export,
)
from jobs_subject.testing import LocalStep


class Person(BaseModel):
    user_id: int


class RecordingTarget:
    """A target that remembers what it was handed (the test's stand-in for an auth provider)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.columns = ["account", "email"]
        self.erased: list[dict[str, Any]] = []
        self.pages: list[Any] = []

    async def erase(self, subject: dict[str, Any]) -> int:
        self.erased.append(subject)
        return 1

    def export_page(self, subject: dict[str, Any], cursor: Any) -> tuple[list[Any], Any]:
        self.pages.append(cursor)
        page = cursor or 0
        rows = [{"account": f"acct-{subject['id']}-{page}", "email": subject["email"]}]
        return rows, (page + 1 if page < 2 else None)


def _name() -> str:
    return f"u-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def seeded(conn: psycopg.Connection[Any], app_schema: str) -> str:
    world.create(conn, app_schema)
    world.seed_statements(conn, app_schema)
    return app_schema


async def _erase(driver: PostgresDriver, registry: JobRegistry, handle: Any, user: int = 1) -> Any:
    queued = await handle.enqueue(Person(user_id=user))
    await run_jobs(driver, registry=registry, timeout="60s")
    found = await driver.introspect.get(queued.id)
    assert found is not None
    return found


async def test_an_erase_leaves_nothing_of_the_subject_and_its_result_is_the_record(
    driver: PostgresDriver,
    registry: JobRegistry,
    seeded: str,
    conn: psycopg.Connection[Any],
) -> None:
    auth = RecordingTarget("auth")
    audit = RecordingTarget("audit")
    subject = world.declare(
        seeded, name=_name(), targets=[auth, (audit, Treatment.RETAIN("kept by the auditors"))]
    )
    handle = subject_erase(
        name="users.erase", input=Person, tenant="none", subject=subject, registry=registry
    )
    before = world.counts(conn, seeded)
    mine = world.members(conn, seeded, 1)
    team = "SELECT array_agg(id ORDER BY id) FROM users WHERE team_id = 1"
    members = conn.execute(team).fetchone()[0]
    done = await _erase(driver, registry, handle)

    assert done.state == JobState.DONE, done.last_error
    assert {k: v for k, v in world.members(conn, seeded, 1).items() if v} == {}
    after = world.counts(conn, seeded)
    assert after["invoices"] == before["invoices"]  # RETAIN: exported, never erased
    assert after["audit_log"] == before["audit_log"]  # ANONYMIZE: kept, with the key cleared
    assert conn.execute("SELECT count(*) FROM audit_log WHERE ip IS NULL").fetchone()[0] == 10
    assert after["orgs"] == before["orgs"]
    record = done.result
    assert record["subject"] == subject.name and record["rounds"] == 1
    assert datetime.fromisoformat(record["erased_at"]).utcoffset().total_seconds() == 0
    assert record["tables"]["users"] == {"treatment": "delete", "rows": 1}
    assert record["tables"]["invoices"] == {
        "treatment": "retain",
        "reason": "legal hold, 10 years",
        "rows": mine["invoices"],
    }
    assert record["tables"]["audit_log"] == {
        "treatment": "anonymize",
        "anonymize": ["actor_id", "ip"],
        "rows": mine["audit_log"],
    }
    for table in ("posts", "orders", "sessions", "addresses", "memberships"):
        assert record["tables"][table]["rows"] == mine[table] == before[table] - after[table]
    # The members of the team the subject owned lost their team, not their account.
    assert record["cleared"]["users.users_team_fk"] == {"columns": ["team_id"], "rows": 3}
    assert members == [1, 3, 5]
    assert conn.execute("SELECT id, team_id FROM users WHERE id IN (3, 5)").fetchall() == [
        (3, None),
        (5, None),
    ]
    assert record["targets"] == {
        "auth": {"treatment": "delete", "erased": 1},
        "audit": {"treatment": "retain", "reason": "kept by the auditors"},
    }
    # The target got the subject's row read in its step; the RETAIN target was never erased.
    assert [row["email"] for row in auth.erased] == ["user1@example.com"]
    assert audit.erased == []
    # Step outputs hold cursors and counts: no value of the person's rows is kept in the run.
    stored = json.dumps([step.output for step in done.steps])
    for value in ("user1@example.com", "User 1", "hash-", "Main Street", "Comment"):
        assert value not in stored
    assert json.dumps(record).count("@") == 0


async def test_the_passes_run_children_first_a_page_of_parent_keys_per_step(
    driver: PostgresDriver, registry: JobRegistry, seeded: str
) -> None:
    subject = world.declare(seeded, name=_name(), batch=2)
    handle = subject_erase(
        name="users.erase.pages", input=Person, tenant="none", subject=subject, registry=registry
    )
    done = await _erase(driver, registry, handle)
    assert done.state == JobState.DONE, done.last_error
    names = [step.name for step in done.steps]
    assert names[0] == "census" and names[-1] == "finished"
    assert names[-2] == "erase:users"
    # The loop-closing keys first, then the tables; comments by pages of 2 of the 5 posts.
    first_table = names.index(next(n for n in names if n.startswith("erase:")))
    assert all(n.startswith("clear:") for n in names[1:first_table])
    by_post = [n for n in names if n.startswith("erase:comments:comments_post_id_fkey:")]
    assert by_post == [f"erase:comments:comments_post_id_fkey:{i}" for i in range(3)]
    outputs = {step.name: step.output for step in done.steps}
    assert [outputs[n]["keys"] for n in by_post] == [2, 2, 1]
    assert outputs[by_post[0]]["cursor"] == ["2"] and outputs[by_post[-1]]["cursor"] is None
    position = {n.split(":")[1]: i for i, n in enumerate(names) if n.startswith("erase:")}
    for child, parent in [
        ("comment_likes", "comments"),
        ("comments", "posts"),
        ("membership_grants", "memberships"),
        ("order_items", "orders"),
        ("teams", "users"),
        ("posts", "users"),
    ]:
        assert position[child] < position[parent]


async def test_an_erase_run_again_finds_nothing_and_succeeds(
    driver: PostgresDriver, registry: JobRegistry, seeded: str, conn: psycopg.Connection[Any]
) -> None:
    subject = world.declare(seeded, name=_name())
    handle = subject_erase(
        name="users.erase.twice", input=Person, tenant="none", subject=subject, registry=registry
    )
    first = await _erase(driver, registry, handle)
    state = world.digests(conn, seeded)
    second = await _erase(driver, registry, handle)
    assert first.id != second.id and second.state == JobState.DONE
    assert world.digests(conn, seeded) == state
    assert all(table["rows"] == 0 for table in second.result["tables"].values())


async def test_rows_written_under_a_passed_table_are_caught_by_another_round(
    driver: PostgresDriver, registry: JobRegistry, seeded: str, pg_url: str, conn: Any
) -> None:
    """A comment inserted on the subject's post after the comments pass makes the posts delete
    fail its foreign key; the round ends, a second round deletes the late comment and the post."""
    subject = world.declare(seeded, name=_name())
    handle = subject_erase(
        name="users.erase.late", input=Person, tenant="none", subject=subject, registry=registry
    )
    inserted: list[int] = []

    def late_comment(boundary: Boundary) -> None:
        if boundary.point == "persisted" and boundary.step.startswith(
            "erase:comments:comments_post_id_fkey:"
        ):
            with psycopg.connect(pg_url, autocommit=True) as other:
                other.execute(
                    f'INSERT INTO "{seeded}".comments VALUES (%s, 1, 2, NULL, %s, now())',
                    [900_000 + len(inserted), "late"],
                )
            inserted.append(1)

    install_fault_hook(late_comment)
    try:
        done = await _erase(driver, registry, handle)
    finally:
        install_fault_hook(None)
    assert inserted and done.state == JobState.DONE, done.last_error
    assert done.result["rounds"] == 2
    names = [step.name for step in done.steps]
    assert "r1:erase:posts:posts_author_id_fkey:0" in names
    assert {k: v for k, v in world.members(conn, seeded, 1).items() if v} == {}
    assert conn.execute("SELECT count(*) FROM comments WHERE id >= 900000").fetchone()[0] == 0


async def test_three_blocked_rounds_end_the_attempt_with_x_subject_erase_blocked(
    driver: PostgresDriver, registry: JobRegistry, seeded: str, pg_url: str, conn: Any
) -> None:
    subject = world.declare(seeded, name=_name())
    handle = subject_erase(
        name="users.erase.blocked",
        input=Person,
        tenant="none",
        subject=subject,
        registry=registry,
        retry=Retry(attempts=1),
    )
    serial = iter(range(900_000, 900_100))

    def keep_writing(boundary: Boundary) -> None:
        if boundary.point == "persisted" and ":erase:comments:comments_post_id_fkey:" in (
            ":" + boundary.step
        ):
            with psycopg.connect(pg_url, autocommit=True) as other:
                other.execute(
                    f'INSERT INTO "{seeded}".comments VALUES (%s, 1, 2, NULL, %s, now())',
                    [next(serial), "late"],
                )

    before = world.counts(conn, seeded)
    install_fault_hook(keep_writing)
    try:
        done = await _erase(driver, registry, handle)
    finally:
        install_fault_hook(None)
    assert done.state == JobState.DEAD
    assert "X_SUBJECT_ERASE_BLOCKED" in (done.last_error or "")
    names = [step.name for step in done.steps]
    assert "r2:erase:users" in names and "r3:census" not in names and "finished" not in names
    # Each round's posts delete (one statement for the page of all five) was refused whole.
    assert world.counts(conn, seeded)["posts"] == before["posts"]


async def test_subject_erase_tables_runs_the_passes_alone(
    driver: PostgresDriver, seeded: str, conn: psycopg.Connection[Any]
) -> None:
    subject = world.declare(seeded, name=_name(), batch=3)
    step = LocalStep()
    erased = await subject_erase_tables(subject, 2, step)
    assert erased["rounds"] == 1
    assert erased["tables"]["users"] == 1 and erased["tables"]["invoices"] == 0
    assert {k: v for k, v in world.members(conn, seeded, 2).items() if v} == {}
    assert world.members(conn, seeded, 1)["posts"] == 5  # nobody else's rows
    assert "census" not in step.names and step.names[-1] == "erase:users"


async def test_a_subject_keyed_by_two_columns_is_erased_by_its_composite_key(
    driver: PostgresDriver, registry: JobRegistry, conn: psycopg.Connection[Any], app_schema: str
) -> None:
    conn.execute(
        "CREATE TABLE accounts (org_id int, id int, email text NOT NULL, PRIMARY KEY (org_id, id))"
    )
    conn.execute(
        "CREATE TABLE notes (id int PRIMARY KEY, org_id int NOT NULL, account_id int NOT NULL, "
        "FOREIGN KEY (org_id, account_id) REFERENCES accounts)"
    )
    conn.execute("INSERT INTO accounts VALUES (1, 7, 'a'), (2, 7, 'b'), (1, 8, 'c')")
    conn.execute("INSERT INTO notes VALUES (1, 1, 7), (2, 2, 7), (3, 1, 8), (4, 1, 7)")

    class Account(BaseModel):
        org_id: int
        id: int

    subject = define_subject(
        table="accounts",
        key=["org_id", "id"],
        schema=app_schema,
        tables={"notes": Treatment.DELETE},
        name=_name(),
    )
    handle = subject_erase(
        name="accounts.erase",
        input=Account,
        tenant="none",
        subject=subject,
        key=lambda i: (i.org_id, i.id),
        registry=registry,
    )
    queued = await handle.enqueue(Account(org_id=1, id=7))
    await run_jobs(driver, registry=registry, timeout="60s")
    done = await driver.introspect.get(queued.id)
    assert done is not None and done.state == JobState.DONE, done and done.last_error
    assert done.result["tables"] == {
        "notes": {"treatment": "delete", "rows": 2},
        "accounts": {"treatment": "delete", "rows": 1},
    }
    assert conn.execute("SELECT * FROM accounts ORDER BY org_id, id").fetchall() == [
        (1, 8, "c"),
        (2, 7, "b"),
    ]
    assert conn.execute("SELECT id FROM notes ORDER BY id").fetchall() == [(2,), (3,)]


async def test_a_subject_anonymized_keeps_its_row_and_clears_its_team(
    driver: PostgresDriver, registry: JobRegistry, seeded: str, conn: psycopg.Connection[Any]
) -> None:
    subject = world.declare(
        seeded,
        name=_name(),
        tables={"users": Treatment.ANONYMIZE({"name": None, "password_hash": "erased"})},
    )
    handle = subject_erase(
        name="users.erase.tombstone",
        input=Person,
        tenant="none",
        subject=subject,
        registry=registry,
    )
    done = await _erase(driver, registry, handle)
    assert done.state == JobState.DONE, done.last_error
    assert "anonymize:users" in [step.name for step in done.steps]
    assert conn.execute(
        "SELECT id, name, password_hash, team_id FROM users WHERE id = 1"
    ).fetchone() == (
        1,
        None,
        "erased",
        None,
    )
    assert conn.execute("SELECT count(*) FROM invoices WHERE user_id = 1").fetchone()[0] == 3
    assert world.members(conn, seeded, 1)["posts"] == 0


async def test_without_a_driver_of_its_own_the_subject_needs_postgresql_to_run_on(
    registry: JobRegistry, seeded: str
) -> None:
    from jobs_core.drivers.memory import MemoryDriver

    subject = world.declare(seeded, name=_name())
    handle = subject_erase(
        name="users.erase.memory", input=Person, tenant="none", subject=subject, registry=registry
    )
    memory = MemoryDriver()
    with use_driver(memory):
        queued = await handle.enqueue(Person(user_id=1))
        await run_jobs(memory, registry=registry, timeout="30s")
        found = await memory.introspect.get(queued.id)
    assert found is not None and found.state == JobState.DEAD and found.attempt == 1
    assert (found.last_error or "").startswith("X_NOT_IMPLEMENTED")


def test_a_factory_names_every_bad_field_and_a_second_job_of_one_name_collides(
    registry: JobRegistry,
) -> None:
    class Pair(BaseModel):
        org_id: int
        user_id: int

    with pytest.raises(JobDeclarationInvalidError) as caught:
        subject_export(
            name="",
            input=Pair,
            tenant="none",
            subject="users",  # type: ignore[arg-type]
            sink="exports",  # type: ignore[arg-type]
            prefix=lambda i: "x",
            format="xml",  # type: ignore[arg-type]
            registry=registry,
        )
    problems = caught.value.meta["problems"]
    assert [p.split(":")[0] for p in problems] == ["name", "subject", "key", "format", "sink"]
    subject = define_subject(table="users", key="id", name=_name())
    made = [
        subject_erase(
            name="dup.erase", input=Person, tenant="none", subject=subject, registry=registry
        )
        for _ in range(2)
    ]
    assert registry.get("dup.erase") is made[1]  # the same call again is a reload
    with pytest.raises(JobDuplicateError):
        subject_erase(
            name="dup.erase", input=Person, tenant="none", subject=subject, registry=registry
        )
