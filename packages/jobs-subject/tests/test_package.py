"""The distribution's seams: entry points, ``jobsctl subject plan`` and ``jobsctl manifest`` in
real subprocesses, every SQL block used, and the README's example run as written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import psycopg
import pytest

import jobs_subject
import subject_world as world
from jobs_subject._sql import blocks
from jobs_subject.cli import register

TESTS = Path(__file__).parent
PACKAGE = TESTS.parent


def _jobsctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(TESTS), str(TESTS / "apps")])
    return subprocess.run(
        [sys.executable, "-m", "jobs_core", *args],
        env={**os.environ, "PYTHONPATH": path, "COLUMNS": "200", **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def seeded(conn: psycopg.Connection[Any], app_schema: str) -> str:
    world.create(conn, app_schema)
    world.seed_statements(conn, app_schema)
    return app_schema


def test_the_factories_and_the_cli_group_are_registered() -> None:
    factories = {ep.name: ep for ep in entry_points(group="jobs.factories")}
    assert factories["subject_export"].load() is jobs_subject.subject_export
    assert factories["subject_erase"].load() is jobs_subject.subject_erase
    (cli,) = [ep for ep in entry_points(group="jobs.cli") if ep.name == "subject"]
    assert cli.load() is register


def test_jobsctl_subject_plan_prints_the_plan_and_touches_no_row(
    pg_url: str, seeded: str, conn: psycopg.Connection[Any]
) -> None:
    before = world.digests(conn, seeded)
    env = {"SUBJECT_APP_SCHEMA": seeded}
    answer = _jobsctl(
        "subject",
        "plan",
        "user",
        "--app",
        "subject_kill_app",
        "--driver",
        pg_url,
        "--json",
        env=env,
    )
    assert answer.returncode == 0, answer.stderr
    plan = json.loads(answer.stdout)
    assert plan["name"] == "user" and plan["subject"] == "users" and plan["key"] == ["id"]
    assert plan["schema"] == seeded and plan["order"][-1] == "users"
    tables = {t["table"]: t for t in plan["tables"]}
    assert set(tables) == set(world.TABLES) - {"orgs"}
    assert tables["membership_grants"]["path"] == (
        "users.id <- memberships.user_id <- membership_grants(org_id, user_id)"
    )
    assert tables["membership_grants"]["keys"] == [
        {
            "key": "membership_grants_org_id_user_id_fkey",
            "columns": ["org_id", "user_id"],
            "references": "memberships",
            "referenced_columns": ["org_id", "user_id"],
            "on_delete": "no action",
        }
    ]
    assert tables["posts"]["keys"][0]["on_delete"] == "restrict"
    assert tables["invoices"]["reason"] == "legal hold, 10 years"
    assert tables["users"]["export_columns"] == world.COLUMNS["users"]
    assert [(c["table"], c["columns"]) for c in plan["clear"]] == [
        ("comments", ["parent_id"]),
        ("users", ["team_id"]),
    ]
    order = plan["order"]
    assert order.index("comment_likes") < order.index("comments") < order.index("posts")
    assert plan["targets"] == []
    shown = _jobsctl(
        "subject", "plan", "user", "--app", "subject_kill_app", "--driver", pg_url, env=env
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"subject user: users (id) in schema {seeded}, 14 tables")
    assert "users.team_id (users_team_fk): users.id <- teams.owner_id <- users.team_id" in (
        shown.stdout
    )
    assert world.digests(conn, seeded) == before


def test_jobsctl_subject_plan_prints_a_refusal_and_exits_2(
    pg_url: str, seeded: str, conn: psycopg.Connection[Any]
) -> None:
    conn.execute("CREATE TABLE referrals (id int PRIMARY KEY, user_id bigint REFERENCES users)")
    env = {"SUBJECT_APP_SCHEMA": seeded}
    answer = _jobsctl(
        "subject", "plan", "user", "--app", "subject_kill_app", "--driver", pg_url, env=env
    )
    assert answer.returncode == 2
    assert "X_SUBJECT_TABLE_UNDECLARED" in answer.stderr
    assert "referrals, reached by users.id <- referrals.user_id" in answer.stderr
    assert "fix: Add the table to define_subject(tables={...})" in " ".join(answer.stderr.split())
    unknown = _jobsctl("subject", "plan", "nobody", "--app", "subject_kill_app", env=env)
    assert (
        unknown.returncode == 2 and "no subject named 'nobody' (declared: user)" in unknown.stderr
    )


def test_jobsctl_manifest_lists_both_factories_and_the_declared_jobs() -> None:
    answer = _jobsctl("manifest", "subject_kill_app", "--json")
    assert answer.returncode == 0, answer.stderr
    entries = json.loads(answer.stdout)
    factories = {(e["name"], e["distribution"]) for e in entries if e["kind"] == "factory"}
    assert {("subject_export", "jobs-subject"), ("subject_erase", "jobs-subject")} <= factories
    jobs = {e["name"] for e in entries if e["kind"] == "job"}
    assert {"subject.kill.erase", "subject.kill.export"} <= jobs


def test_every_sql_block_is_used() -> None:
    source = "\n".join(p.read_text() for p in (PACKAGE / "src/jobs_subject").glob("*.py"))
    for name in blocks():
        assert f'block("{name}")' in source, f"block {name} of subject.sql is never used"


def test_the_readmes_example_runs_and_prints_what_it_says(pg_url: str, tmp_path: Path) -> None:
    readme = (PACKAGE / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S)
    promised = re.search(r"It prints:\n\n```\n(.*?)```", readme, re.S)
    shown = re.search(r"```\n\$ (jobsctl subject plan .*?)\n(.*?)```", readme, re.S)
    assert code is not None and promised is not None and shown is not None
    (tmp_path / "subject_demo.py").write_text(code.group(1))
    demo = f"d_{uuid.uuid4().hex[:16]}"
    env = {**os.environ, "JOBS_PG_URL": pg_url, "DEMO_SCHEMA": demo, "COLUMNS": "200"}
    try:
        answer = subprocess.run(
            [sys.executable, "subject_demo.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        planned = subprocess.run(
            [sys.executable, "-m", "jobs_core", *shown.group(1).split()[1:]],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{demo}" CASCADE')
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout == promised.group(1)
    assert planned.returncode == 0, planned.stderr
    lines = [line.rstrip() for line in planned.stdout.replace(demo, "subject_demo").splitlines()]
    assert lines == shown.group(2).splitlines()
