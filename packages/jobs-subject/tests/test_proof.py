"""subject_proof: ~10,000 seeded rows of 20 people, one erased, the outcome proven by digests;
and the proof failing when an erase leaves a table otherwise than it must."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

import subject_world as world
from jobs_pg import PostgresDriver
from jobs_subject.testing import subject_proof


@pytest.fixture
def tables(conn: psycopg.Connection[Any], app_schema: str) -> str:
    world.create(conn, app_schema)
    return app_schema


async def test_erasing_one_of_twenty_people_leaves_nothing_of_them_and_everyone_else_intact(
    driver: PostgresDriver, tables: str, conn: psycopg.Connection[Any]
) -> None:
    subject = world.declare(tables, name=f"u-{uuid.uuid4().hex[:8]}", driver=driver)

    async def seed(lent: Any) -> int:
        await world.seed_async(lent, tables, world.PROOF)
        return 3  # owns team 3 and is in it; has posts, comments, replies, likes

    report = await subject_proof(subject, seed)
    seeded = sum(p.subject_rows + p.other_rows for p in report.tables.values())
    assert 9_500 <= seeded <= 10_500
    assert all(p.proven for p in report.tables.values())
    assert report.tables["orgs"].treatment == "untouched"
    invoices = report.tables["invoices"]
    assert invoices.treatment == "retain" and invoices.subject_rows == 3
    assert invoices.rows_after == invoices.subject_rows + invoices.other_rows
    for shown in ("comments", "comment_likes", "posts", "users"):
        proof = report.tables[shown]
        assert proof.subject_rows > 0 and proof.rows_after == proof.other_rows
    assert {k: v for k, v in world.members(conn, tables, 3).items() if v} == {}
    # Erasing the owner of a team: its members keep their accounts, lose the team.
    second = world.declare(tables, name=f"u-{uuid.uuid4().hex[:8]}", driver=driver)

    async def nothing(lent: Any) -> int:
        return 1

    owner = await subject_proof(second, nothing)
    assert owner.erased["cleared"]["users.users_team_fk"] > 1
    assert owner.tables["users"].rows_after == 18  # 20 seeded, two erased


async def test_the_proof_fails_when_something_else_changed_another_persons_rows(
    driver: PostgresDriver, tables: str, conn: psycopg.Connection[Any]
) -> None:
    """An app trigger the declaration knows nothing about rewrites other people's rows when
    a post is deleted; the proof names the table."""
    conn.execute(
        "CREATE FUNCTION touch() RETURNS trigger LANGUAGE plpgsql AS "
        f"$$ BEGIN UPDATE \"{tables}\".addresses SET city = 'Lyon' WHERE user_id = 2; "
        "RETURN OLD; END $$"
    )
    conn.execute("CREATE TRIGGER touch AFTER DELETE ON posts FOR EACH ROW EXECUTE FUNCTION touch()")
    subject = world.declare(tables, name=f"u-{uuid.uuid4().hex[:8]}", driver=driver)

    async def seed(lent: Any) -> int:
        await world.seed_async(lent, tables, world.SMALL)
        return 1

    with pytest.raises(AssertionError, match=r"addresses \(delete\) does not end as the erase"):
        await subject_proof(subject, seed)


async def test_the_proof_fails_when_the_seed_gave_the_subject_nothing_in_a_table(
    driver: PostgresDriver, tables: str
) -> None:
    subject = world.declare(tables, name=f"u-{uuid.uuid4().hex[:8]}", driver=driver)

    async def seed(lent: Any) -> int:
        await world.seed_async(lent, tables, world.SMALL)
        await lent.execute(f'DELETE FROM "{tables}".sessions WHERE user_id = 2', prepare=False)
        return 2

    with pytest.raises(AssertionError, match="the seed gave the subject no rows in sessions"):
        await subject_proof(subject, seed)


async def test_the_proof_holds_for_a_subject_kept_as_an_anonymized_tombstone(
    driver: PostgresDriver, tables: str
) -> None:
    from jobs_subject import Treatment

    subject = world.declare(
        tables,
        name=f"u-{uuid.uuid4().hex[:8]}",
        driver=driver,
        tables={"users": Treatment.ANONYMIZE({"name": None, "email": "erased-1@invalid"})},
    )

    async def seed(lent: Any) -> int:
        await world.seed_async(lent, tables, world.SMALL)
        return 1

    report = await subject_proof(subject, seed)
    users = report.tables["users"]
    assert users.treatment == "anonymize" and users.rows_after == 6
    # The tombstone still exists, so the invoices keep pointing at it: no SET NULL fired.
    assert report.tables["invoices"].proven and report.erased["tables"]["users"] == 1
