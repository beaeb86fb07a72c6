"""Django: a real project (tests/djangoproject) on PostgreSQL, driven through its own view, its
manage.py and the jobs_worker management command, each in a process of its own.

The view creates an Order and enqueues ``ship(order.id)`` inside ``transaction.atomic()``:
raising after the enqueue leaves neither; a nested atomic that rolls back drops only its job;
returning commits both, and ``manage.py jobs_worker`` (worker + relay) runs the job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

PROJECT = Path(__file__).parent / "djangoproject"


def env_for(pg_url: str, schema: str) -> dict[str, str]:
    return {
        **os.environ,
        "SHOP_DB_URL": pg_url,
        "SHOP_SCHEMA": schema,
        "DJANGO_SETTINGS_MODULE": "site_settings",
        "PYTHONPATH": os.pathsep.join([str(PROJECT), *sys.path]),
    }


def manage(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "manage.py", *argv],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done


def counts(pg_url: str, schema: str) -> dict[str, Any]:
    with psycopg.connect(pg_url) as conn:
        orders = conn.execute(f'SELECT id, shipped FROM "{schema}".shop_order').fetchall()
        outbox = conn.execute(f'SELECT count(*) FROM "{schema}".outbox').fetchone()
        jobs = conn.execute(f'SELECT input, state FROM "{schema}".jobs').fetchall()
    assert outbox is not None
    return {"orders": orders, "outbox": int(outbox[0]), "jobs": jobs}


@pytest.fixture
def project(pg_url: str, schema: str) -> dict[str, str]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    env = env_for(pg_url, schema)
    manage(env, "migrate", "--noinput")
    applied = manage(env, "jobs_migrate").stdout
    assert "applied 0001" in applied
    assert "up to date" in manage(env, "jobs_migrate").stdout
    return env


def drive(env: dict[str, str], *kinds: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "drive.py", *kinds],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_an_order_view_commits_or_rolls_back_its_job_with_the_order(
    project: dict[str, str], pg_url: str, schema: str
) -> None:
    answers = drive(project, "after", "inner", "ok")
    assert [a["status"] for a in answers] == [500, 200, 200]
    kept_inner = json.loads(answers[1]["body"])["order"]
    committed = json.loads(answers[2]["body"])
    state = counts(pg_url, schema)
    # "after": neither the order nor the job. "inner": the order, not its job. "ok": both,
    # the job staged in the outbox until a relay publishes it.
    assert sorted(o[0] for o in state["orders"]) == sorted([kept_inner, committed["order"]])
    assert state["outbox"] == 1
    assert state["jobs"] == []

    worker = subprocess.Popen(
        [sys.executable, "manage.py", "jobs_worker", "--drain-timeout", "5s"],
        cwd=PROJECT,
        env=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = counts(pg_url, schema)
            if any(shipped for _, shipped in state["orders"]):
                break
            time.sleep(0.2)
    finally:
        worker.send_signal(signal.SIGTERM)
        output, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, output
    state = counts(pg_url, schema)
    shipped = {order_id: done for order_id, done in state["orders"]}
    assert shipped == {kept_inner: False, committed["order"]: True}, output
    assert [(job_input, s) for job_input, s in state["jobs"]] == [
        ({"order_id": committed["order"]}, "done")
    ]


def test_an_unknown_jobs_setting_is_refused_at_start_up(pg_url: str, schema: str) -> None:
    env = env_for(pg_url, schema)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django, site_settings as s; s.JOBS['POOL'] = 3; django.setup()",
        ],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "JOBS has unknown keys ['POOL']" in done.stderr
