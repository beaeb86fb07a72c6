"""A new user's first-run mistakes answer with their code and fix, exit 2, never a traceback.

Each mistake is made for real: a fresh schema never migrated, a database that does not exist,
a role of the test's own without privileges (made and dropped here), a wrong password (against a
PRIVATE server with scram-sha-256: the shared one trusts every local connection, so no password
is ever checked there), and ``jobsctl enqueue`` then ``jobsctl show --json`` once it all works.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from jobs_core.errors import (
    AuthenticationFailedError,
    DatabaseNotFoundError,
    SchemaNotMigratedError,
)
from jobs_pg import PostgresDriver
from pg_helpers import APPS

JOBSCTL = [sys.executable, "-m", "jobs_core.cli"]


def jobsctl(*args: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run the CLI as a user would; answer its result and how long it took (s)."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "COLUMNS")}
    env |= {"NO_COLOR": "1", "PYTHONPATH": str(APPS), "JOBS_DRIVER": ""}
    started = time.monotonic()
    done = subprocess.run(
        [*JOBSCTL, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    return done, time.monotonic() - started


def assert_told(done: subprocess.CompletedProcess[str], code: str, *said: str) -> None:
    """Exit 2, the code and every ``said`` text on stderr, once, and no traceback."""
    err = done.stderr
    assert done.returncode == 2, done.stdout + err
    assert f"error {code}" in err, err
    assert "fix: " in err, err
    for text in said:
        assert text in err, f"{text!r} not in:\n{err}"
    assert "Traceback" not in err, err
    assert "psycopg" not in err, err
    assert err.count(f"error {code}") == 1, err


def startup_seconds() -> float:
    """How long the CLI takes to start and exit 2 without touching a database (the baseline)."""
    done, took = jobsctl("worker", "pg_greet_missing", "--driver", "memory://")
    assert done.returncode == 2, done.stderr
    return took


def test_an_unmigrated_schema_stops_the_worker_within_2_s(url: str, schema: str) -> None:
    baseline = startup_seconds()
    done, took = jobsctl("worker", "pg_greet", "--driver", url)

    assert_told(
        done,
        "X_SCHEMA_NOT_MIGRATED",
        f"schema '{schema}' is not migrated",
        f"jobsctl pg migrate --driver postgresql://postgres@127.0.0.1:5432/test --schema {schema}",
    )
    # It refused before serving: no banner, no claim tried.
    assert "jobs.worker.started" not in done.stderr
    assert "jobs.claim.failed" not in done.stderr
    # The worker's own time, past the interpreter's start that any command pays.
    assert took - baseline < 2.0, f"took {took:.2f} s, baseline {baseline:.2f} s"


async def test_enqueue_and_ls_on_an_unmigrated_schema_say_run_migrate(
    url: str, pg_url: str, schema: str
) -> None:
    listed, _ = jobsctl("ls", "--driver", url)
    queued, _ = jobsctl(
        "enqueue", "greet", "--input", '{"name": "ada"}', "--app", "pg_greet", "--driver", url
    )

    for done in (listed, queued):
        assert_told(done, "X_SCHEMA_NOT_MIGRATED", "run: jobsctl pg migrate --driver")
    driver = PostgresDriver(pg_url, schema=schema, min_size=0, max_size=1)
    try:
        with pytest.raises(SchemaNotMigratedError) as caught:
            await driver.stats()
        assert caught.value.meta == {"schema": schema}
    finally:
        await driver.close()


async def test_a_database_that_does_not_exist_is_told_once_at_once(pg_url: str) -> None:
    missing = f"t_nodb_{uuid.uuid4().hex[:12]}"
    url = pg_url.rsplit("/", 1)[0] + f"/{missing}"
    baseline = startup_seconds()
    done, took = jobsctl("ls", "--driver", url)

    assert_told(done, "X_DATABASE_NOT_FOUND", f"database '{missing}' does not exist", "createdb")
    assert done.stderr.count(missing) == 1, done.stderr
    assert "error connecting" not in done.stderr  # no pool retries, each logged
    # Well inside the pool's 5 s timeout, which the retries used to run out.
    assert took - baseline < 3.0, f"took {took:.2f} s, baseline {baseline:.2f} s"
    with pytest.raises(DatabaseNotFoundError):
        await PostgresDriver.connect(url, min_size=1, max_size=1)


@pytest.fixture
def lowly_role(pg_url: str) -> Iterator[str]:
    """A LOGIN role of this test's own, granted nothing; dropped with what it was granted."""
    role = f"t_role_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
    yield role
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'DROP OWNED BY "{role}"')
        conn.execute(f'DROP ROLE "{role}"')


def test_a_role_without_privileges_is_told_what_to_grant(
    pg_url: str, migrated: str, lowly_role: str
) -> None:
    as_lowly = pg_url.replace("postgres@", f"{lowly_role}@", 1) + f"?schema={migrated}"

    listed, _ = jobsctl("ls", "--driver", as_lowly)
    assert_told(
        listed, "X_PERMISSION_DENIED", f"role '{lowly_role}'", "permission denied for schema"
    )

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'GRANT USAGE ON SCHEMA "{migrated}" TO "{lowly_role}"')
        conn.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{migrated}" TO "{lowly_role}"')
    serving, _ = jobsctl("worker", "pg_greet", "--driver", as_lowly)
    assert_told(
        serving,
        "X_PERMISSION_DENIED",
        f"lacks SELECT, INSERT, UPDATE or DELETE on {migrated}.",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {migrated} TO {lowly_role}",
    )
    assert "jobs.worker.started" not in serving.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pg_bin(tool: str) -> str:
    found = shutil.which(tool) or next(
        (str(p) for p in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{tool}"))), None
    )
    if found is None:
        pytest.fail(f"{tool} (PostgreSQL's server binaries) is not installed")
    return found


@pytest.fixture
def scram_server() -> Iterator[str]:
    """A PRIVATE PostgreSQL that checks passwords (scram-sha-256), stopped and removed afterwards.

    Answers its URL without a password; the superuser ``postgres`` has the password ``pw``.
    Run as the ``postgres`` OS user when the tests run as root (initdb refuses root), in a
    directory of its own under the system temp dir (pytest's is private to root).
    """
    home = Path(tempfile.mkdtemp(prefix="jobs-scram-"))
    data, password_file = home / "data", home / "pw"
    password_file.write_text("pw\n")
    as_user: list[str] = []
    if os.geteuid() == 0:
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(home, "postgres")
        shutil.chown(password_file, "postgres")
    port = _free_port()
    try:
        _start(as_user, home, data, password_file, port)
    except BaseException:
        shutil.rmtree(home, ignore_errors=True)
        raise
    ctl = [*as_user, _pg_bin("pg_ctl"), "-D", str(data)]
    try:
        yield f"postgresql://127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*ctl, "-m", "immediate", "-w", "stop"], capture_output=True, timeout=120)
        shutil.rmtree(home, ignore_errors=True)


def _start(as_user: list[str], home: Path, data: Path, password_file: Path, port: int) -> None:
    subprocess.run(
        [*as_user, _pg_bin("initdb"), "-D", str(data), "-U", "postgres", "--auth=scram-sha-256",
         f"--pwfile={password_file}", "-E", "UTF8", "--no-sync"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    options = f"-p {port} -k {home} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run(
        [*as_user, _pg_bin("pg_ctl"), "-D", str(data), "-o", options, "-w", "-l",
         str(home / "log"), "start"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip


async def test_a_wrong_password_is_told_and_never_shown(scram_server: str) -> None:
    with psycopg.connect(scram_server.replace("//", "//postgres:pw@"), autocommit=True) as conn:
        conn.execute("CREATE ROLE app LOGIN PASSWORD 'right-horse'")
    wrong = scram_server.replace("//", "//app:wrong-staple@") + "?schema=app_jobs"
    right = scram_server.replace("//", "//app:right-horse@") + "?schema=app_jobs"

    refused, _ = jobsctl("ls", "--driver", wrong)
    admitted, _ = jobsctl("ls", "--driver", right)

    assert_told(refused, "X_AUTH_FAILED", "refused user 'app'", "password authentication failed")
    assert "wrong-staple" not in refused.stderr + refused.stdout
    # The right password gets past the door, to the next first-run mistake in line.
    assert_told(admitted, "X_SCHEMA_NOT_MIGRATED", "app:***@")
    assert "right-horse" not in admitted.stderr + admitted.stdout
    with pytest.raises(AuthenticationFailedError) as caught:
        await PostgresDriver.connect(wrong.split("?")[0], min_size=1, max_size=1)
    assert caught.value.meta["user"] == "app"


async def test_enqueue_then_show_json_on_pg(url: str, migrated: str) -> None:
    first, _ = jobsctl(
        "enqueue", "greet", "--input", '{"name": "ada"}', "--app", "pg_greet", "--driver", url,
        "--json",
    )  # fmt: skip
    again, _ = jobsctl(
        "enqueue", "greet", "--input", '{ "name" : "ada" }', "--app", "pg_greet", "--driver", url,
        "--json",
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert again.returncode == 0, again.stderr
    queued, repeat = json.loads(first.stdout), json.loads(again.stdout)
    assert queued["name"] == "greet" and queued["deduped"] is False
    assert repeat["deduped"] is True and repeat["id"] == queued["id"]

    shown, _ = jobsctl("show", queued["id"], "--json", "--driver", url, "--app", "pg_greet")
    assert shown.returncode == 0, shown.stderr
    job = json.loads(shown.stdout)["job"]
    assert job["id"] == queued["id"]
    assert job["run_id"] == queued["run_id"]
    assert job["name"] == "greet"
    assert job["state"] == "ready"
    assert job["input"] == {"name": "ada"}
    assert job["idempotency_key"].startswith("sha256:")
