"""subject_export to a local sink on real PostgreSQL: parts per page per table and target,
index.json last and listing them, instants in UTC, sealed columns left out, RETAIN included."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel

import subject_world as world
from jobs_core import JobRegistry, JobState
from jobs_core.testing import run_jobs
from jobs_import_export import LocalStorage
from jobs_pg import PostgresDriver
from jobs_subject import Treatment, subject_export


class Person(BaseModel):
    user_id: int


class OrderedSink(LocalStorage):
    """A local sink that records the order of its puts."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.puts: list[str] = []
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes) -> None:
        super().put(key, data)
        with self._lock:
            self.puts.append(key)


class PagedTarget:
    name = "auth"
    columns = ("account", "created")

    def export_page(self, subject: dict[str, Any], cursor: Any) -> tuple[list[Any], Any]:
        page = cursor or 0
        rows = [{"account": f"{subject['email']}#{page}", "created": subject["created_at"]}]
        return rows, (page + 1 if page < 2 else None)

    def erase(self, subject: dict[str, Any]) -> int:
        raise AssertionError("an export never erases")


@pytest.fixture
def seeded(conn: psycopg.Connection[Any], app_schema: str) -> str:
    world.create(conn, app_schema)
    world.seed_statements(conn, app_schema)
    return app_schema


async def _export(
    driver: PostgresDriver, registry: JobRegistry, subject: Any, sink: Any, **options: Any
) -> Any:
    handle = subject_export(
        name=f"export.{uuid.uuid4().hex[:6]}",
        input=Person,
        tenant="none",
        subject=subject,
        sink=lambda: sink,
        prefix=lambda i: f"subjects/{i.user_id}",
        registry=registry,
        **options,
    )
    queued = await handle.enqueue(Person(user_id=1))
    await run_jobs(driver, registry=registry, timeout="60s")
    found = await driver.introspect.get(queued.id)
    assert found is not None and found.state == JobState.DONE, found and found.last_error
    return found


async def test_one_object_per_page_per_table_and_target_and_the_index_last(
    driver: PostgresDriver,
    registry: JobRegistry,
    seeded: str,
    conn: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    subject = world.declare(
        seeded,
        name=f"u-{uuid.uuid4().hex[:8]}",
        batch=2,
        targets=[(PagedTarget(), Treatment.RETAIN("the provider keeps logins"))],
    )
    sink = OrderedSink(tmp_path)
    before = world.digests(conn, seeded)
    done = await _export(driver, registry, subject, sink)
    assert world.digests(conn, seeded) == before  # an export touches no row

    assert sink.puts[-1] == "subjects/1/index.json"
    assert sink.puts.count("subjects/1/index.json") == 1
    index = json.loads((tmp_path / "subjects/1/index.json").read_text())
    listed = [p["key"] for entry in index["tables"] + index["targets"] for p in entry["parts"]]
    assert sorted(listed) == sorted(sink.puts[:-1])  # every part listed, nothing else written
    assert done.result == {
        "index": "subjects/1/index.json",
        "subject": subject.name,
        "format": "ndjson",
        "parts": len(listed),
        "rows": index["rows"],
        "bytes": index["bytes"],
    }
    tables = {entry["table"]: entry for entry in index["tables"]}
    assert index["tables"][0]["table"] == "users"  # the subject first, parents before children
    # comments of the subject: by author (one page: one parent key), then by the 5 posts in
    # pages of 2; a page of parent keys with no rows writes no part.
    comments = tables["comments"]
    mine = conn.execute(
        "SELECT count(*) FROM comments WHERE author_id = 1 OR post_id IN "
        "(SELECT id FROM posts WHERE author_id = 1)"
    ).fetchone()[0]
    assert comments["rows"] == mine  # a row reached by both keys is written once
    assert [p["key"].rsplit("/", 1)[1] for p in comments["parts"]] == [
        f"part-{i:05d}.ndjson" for i in range(4)
    ]
    exported = [
        json.loads(line)
        for p in comments["parts"]
        for line in (tmp_path / p["key"]).read_text().splitlines()
    ]
    assert len({row["id"] for row in exported}) == mine == len(exported)
    # Sealed columns left out; instants ISO 8601 in UTC; RETAIN tables exported.
    (user,) = [
        json.loads(x)
        for x in (tmp_path / "subjects/1/tables/users/part-00000.ndjson").read_text().splitlines()
    ]
    assert user == {
        "id": 1,
        "email": "user1@example.com",
        "name": "User 1",
        "team_id": 1,
        "created_at": "2026-01-01T01:00:00+00:00",
    }
    assert tables["users"]["columns"] == ["id", "email", "name", "team_id", "created_at"]
    orders = [
        json.loads(line)
        for p in tables["orders"]["parts"]
        for line in (tmp_path / p["key"]).read_text().splitlines()
    ]
    assert orders[0]["placed_at"] == "2026-05-02T07:00:00+00:00"  # stored as +02:00
    assert orders[0]["total"] == "10.00"
    assert tables["invoices"]["treatment"] == "retain" and tables["invoices"]["rows"] == 3
    assert tables["invoices"]["reason"] == "legal hold, 10 years"
    profile = json.loads((tmp_path / tables["profiles"]["parts"][0]["key"]).read_text())
    assert profile["avatar"] and isinstance(profile["avatar"], str)  # bytea as base64
    (target,) = index["targets"]
    assert target["target"] == "auth" and target["treatment"] == "retain"
    assert [p["key"] for p in target["parts"]] == [
        f"subjects/1/targets/auth/part-{i:05d}.ndjson" for i in range(3)
    ]
    first = json.loads((tmp_path / target["parts"][0]["key"]).read_text())
    assert first == {"account": "user1@example.com#0", "created": "2026-01-01T01:00:00+00:00"}
    # Step outputs are cursors and counts: the person's data is in the sink, not in the run.
    stored = json.dumps([step.output for step in done.steps])
    assert "user1@example.com" not in stored and "Main Street" not in stored


async def test_a_csv_export_has_the_header_in_each_tables_first_part_and_guards_formulas(
    driver: PostgresDriver,
    registry: JobRegistry,
    seeded: str,
    conn: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    conn.execute("UPDATE users SET name = '=HYPERLINK(\"x\")' WHERE id = 1")
    subject = world.declare(seeded, name=f"u-{uuid.uuid4().hex[:8]}", batch=2)
    await _export(driver, registry, subject, LocalStorage(tmp_path), format="csv")
    users = (tmp_path / "subjects/1/tables/users/part-00000.csv").read_text()
    assert users == (
        'id,email,name,team_id,created_at\n1,user1@example.com,"\'=HYPERLINK(""x"")",1,'
        "2026-01-01T01:00:00+00:00\n"
    )
    parts = sorted((tmp_path / "subjects/1/tables/comments").glob("part-*.csv"))
    assert parts[0].read_text().startswith("id,post_id,author_id,parent_id,body,created_at\n")
    assert all(not p.read_text().startswith("id,") for p in parts[1:])


def test_database_values_take_their_export_forms() -> None:
    from datetime import UTC, date, datetime, timedelta, timezone
    from decimal import Decimal
    from ipaddress import ip_address

    from jobs_subject._values import exported

    paris = timezone(timedelta(hours=2))
    assert exported(datetime(2026, 5, 2, 9, 0, tzinfo=paris), "csv") == "2026-05-02T07:00:00+00:00"
    assert exported(datetime(2026, 5, 2, 9, 0), "csv") == "2026-05-02T09:00:00"  # no instant
    assert exported(b"\x00\xff", "ndjson") == "AP8="
    assert exported(memoryview(b"ab"), "csv") == "YWI="
    assert exported(timedelta(days=1, seconds=90, microseconds=500_000), "csv") == "P1DT90.5S"
    assert exported(-timedelta(seconds=5), "csv") == "-P0DT5S"
    assert exported(float("nan"), "ndjson") == "nan" and exported(Decimal("NaN"), "csv") == "NaN"
    assert exported(ip_address("10.0.0.1"), "csv") == "10.0.0.1"
    nested = {"at": datetime(2026, 1, 1, tzinfo=UTC), "d": date(2026, 1, 2), "n": [Decimal("1.5")]}
    assert exported(nested, "ndjson") == {
        "at": "2026-01-01T00:00:00+00:00",
        "d": "2026-01-02",
        "n": ["1.5"],
    }
    assert exported(nested, "csv") == (
        '{"at": "2026-01-01T00:00:00+00:00", "d": "2026-01-02", "n": ["1.5"]}'
    )
