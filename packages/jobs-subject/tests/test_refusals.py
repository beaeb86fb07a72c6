"""Every refusal on the worked schema, raised by a real run before any row changed.

Each case seeds the fifteen tables, changes the declaration or the schema the way a team's
drift would, runs ``subject_erase`` (and one ``subject_export``) on the PostgreSQL driver, and
checks the row is dead on its first attempt with the code, attempts unspent, and that every
table holds exactly the rows it held before (digests, not only counts).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel

import subject_world as world
from jobs_core import JobRegistry, JobState
from jobs_core.testing import run_jobs
from jobs_import_export import local_sink
from jobs_pg import PostgresDriver
from jobs_subject import Treatment, subject_erase, subject_export


class Person(BaseModel):
    user_id: int


@pytest.fixture
def seeded(conn: psycopg.Connection[Any], app_schema: str) -> str:
    world.create(conn, app_schema)
    world.seed_statements(conn, app_schema)
    return app_schema


async def _refused(
    driver: PostgresDriver,
    registry: JobRegistry,
    conn: psycopg.Connection[Any],
    schema: str,
    handle: Any,
) -> str:
    """Run ``handle`` for user 1; answer its ``last_error``; prove nothing changed."""
    before_counts = world.counts(conn, schema)
    before = world.digests(conn, schema)
    queued = await handle.enqueue(Person(user_id=1))
    await run_jobs(driver, registry=registry, timeout="60s")
    found = await driver.introspect.get(queued.id)
    assert found is not None
    assert found.state == JobState.DEAD and found.attempt == 1  # terminal: attempts unspent
    assert [step.name for step in found.steps] == []  # refused before the first step
    assert world.counts(conn, schema) == before_counts
    assert world.digests(conn, schema) == before
    return found.last_error or ""


def _erase(registry: JobRegistry, subject: Any) -> Any:
    return subject_erase(
        name=f"erase.{uuid.uuid4().hex[:6]}",
        input=Person,
        tenant="none",
        subject=subject,
        registry=registry,
    )


async def test_a_table_added_after_the_declaration_is_refused_and_named_with_its_key_path(
    driver: PostgresDriver, registry: JobRegistry, conn: psycopg.Connection[Any], seeded: str
) -> None:
    subject = world.declare(seeded, name=f"u-{uuid.uuid4().hex[:8]}")
    handle = _erase(registry, subject)
    # Next month: two tables nobody told the erase about, one of them two keys away.
    conn.execute("CREATE TABLE referrals (id int PRIMARY KEY, user_id bigint REFERENCES users)")
    conn.execute(
        "CREATE TABLE comment_flags (comment_id bigint REFERENCES comments, reason text NOT NULL)"
    )
    conn.execute("INSERT INTO referrals VALUES (1, 1), (2, 3)")
    conn.execute("INSERT INTO comment_flags SELECT id, 'spam' FROM comments WHERE author_id = 1")
    error = await _refused(driver, registry, conn, seeded, handle)
    assert error.startswith("X_SUBJECT_TABLE_UNDECLARED")
    assert "referrals, reached by users.id <- referrals.user_id" in error
    assert (
        "comment_flags, reached by users.id <- comments.author_id <- comment_flags.comment_id"
        in (error)
    )


async def test_anonymizing_a_not_null_column_to_none_is_refused(
    driver: PostgresDriver, registry: JobRegistry, conn: psycopg.Connection[Any], seeded: str
) -> None:
    subject = world.declare(
        seeded,
        name=f"u-{uuid.uuid4().hex[:8]}",
        tables={"addresses": Treatment.ANONYMIZE({"user_id": None, "line1": None})},
    )
    error = await _refused(driver, registry, conn, seeded, _erase(registry, subject))
    assert error.startswith("X_SUBJECT_TREATMENT_INVALID")
    assert "ANONYMIZE of addresses sets line1 to None but the column is NOT NULL" in error
    assert "sets user_id to None but the column is NOT NULL" in error


async def test_keeping_rows_under_a_restrict_key_is_refused(
    driver: PostgresDriver, registry: JobRegistry, conn: psycopg.Connection[Any], seeded: str
) -> None:
    subject = world.declare(
        seeded,
        name=f"u-{uuid.uuid4().hex[:8]}",
        tables={"posts": Treatment.RETAIN("published works")},
    )
    error = await _refused(driver, registry, conn, seeded, _erase(registry, subject))
    assert error.startswith("X_SUBJECT_TREATMENT_INVALID")
    assert "posts is RETAIN but keeps rows referencing users through posts_author_id_fkey" in error
    assert "(ON DELETE RESTRICT)" in error


async def test_a_loop_of_not_null_keys_is_refused_as_a_cycle(
    driver: PostgresDriver, registry: JobRegistry, conn: psycopg.Connection[Any], seeded: str
) -> None:
    conn.execute(
        "CREATE TABLE drafts (id int PRIMARY KEY, user_id bigint NOT NULL REFERENCES users, "
        "revision_id int NOT NULL)"
    )
    conn.execute(
        "CREATE TABLE revisions (id int PRIMARY KEY, draft_id int NOT NULL REFERENCES drafts)"
    )
    conn.execute(
        "ALTER TABLE drafts ADD CONSTRAINT drafts_revision_fk FOREIGN KEY (revision_id) "
        "REFERENCES revisions DEFERRABLE INITIALLY DEFERRED"
    )
    with conn.transaction():
        conn.execute("INSERT INTO drafts VALUES (1, 1, 1)")
        conn.execute("INSERT INTO revisions VALUES (1, 1)")
    subject = world.declare(
        seeded,
        name=f"u-{uuid.uuid4().hex[:8]}",
        tables={"drafts": Treatment.DELETE, "revisions": Treatment.DELETE},
    )
    error = await _refused(driver, registry, conn, seeded, _erase(registry, subject))
    assert error.startswith("X_SUBJECT_CYCLE")
    assert "drafts_revision_fk (drafts.revision_id -> revisions.id) closes a loop" in error
    assert "users.id <- drafts.user_id <- revisions.draft_id <- drafts.revision_id" in error


async def test_an_export_refuses_as_the_erase_does_and_writes_nothing(
    driver: PostgresDriver,
    registry: JobRegistry,
    conn: psycopg.Connection[Any],
    seeded: str,
    tmp_path: Path,
) -> None:
    subject = world.declare(seeded, name=f"u-{uuid.uuid4().hex[:8]}")
    conn.execute("CREATE TABLE referrals (id int PRIMARY KEY, user_id bigint REFERENCES users)")
    handle = subject_export(
        name="export.refused",
        input=Person,
        tenant="none",
        subject=subject,
        sink=lambda: local_sink(tmp_path),
        prefix=lambda i: f"subjects/{i.user_id}",
        registry=registry,
    )
    error = await _refused(driver, registry, conn, seeded, handle)
    assert error.startswith("X_SUBJECT_TABLE_UNDECLARED")
    assert not any(tmp_path.iterdir())  # noqa: ASYNC240 - a test's own temporary folder
