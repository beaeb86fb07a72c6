"""The test matrix: lint, typing, each package's tests, and the demo.

``nox`` runs the default sessions (``nox.options.sessions`` below: lint, typecheck, the core
tests, then each driver's tests and conformance, the other packages' tests, and ``pg-restart``
last, the slowest: it starts private PostgreSQL servers of its own); ``nox -s demo`` runs the
demo. Each driver package adds a ``conformance-<driver>`` session that runs the jobs-conformance
suite against its driver (its tests' conftest opts in; ``-m conformance``). Every tool and test
dependency is pinned once, in ``PINS``, so sessions never disagree.
"""

from __future__ import annotations

import nox

PYTHON = "3.11"

PINS = {
    "ruff": "ruff==0.17.6",
    "mypy": "mypy==2.4.1",
    "pytest": "pytest==9.0.3",
    "pytest-asyncio": "pytest-asyncio==1.5.0",
    "pytest-timeout": "pytest-timeout==2.4.0",
    "hypothesis": "hypothesis==6.155.2",
    "types-croniter": "types-croniter==6.2.4.20261118",
    "opentelemetry-api": "opentelemetry-api==1.45.2",
    "opentelemetry-sdk": "opentelemetry-sdk==1.45.2",
    "redis": "redis==8.1.0",
    "hiredis": "hiredis==3.5.0",
    # jobs-webhooks' tests: the servers they start, the independent verifier, a FastAPI mount.
    "uvicorn": "uvicorn==0.54.0",
    "standardwebhooks": "standardwebhooks==1.1.0",
    "fastapi": "fastapi==0.163.2",
    "moto": "moto[server]==5.2.5",
    # jobs-dashboard's tests: the HTTP client and the browser driver (Debian's Chromium).
    "httpx": "httpx==0.28.1",
    "playwright": "playwright==1.65.2",
    # jobs-pg's framework integrations (the extras jobs-pg[sqlalchemy], jobs-pg[django]) and the
    # Flask example of its README.
    "sqlalchemy": "sqlalchemy[asyncio]==2.1.9",
    "django": "django==5.2.19",
    "flask": "flask==3.1.3",
    "django-stubs": "django-stubs==6.1.2",
}

CORE = "packages/jobs-core"
CONFORMANCE = "conformance"
REDIS = "packages/jobs-redis"
PG = "packages/jobs-pg"
WEBHOOKS = "packages/jobs-webhooks"
IMPORT_EXPORT = "packages/jobs-import-export"
DASHBOARD = "packages/jobs-dashboard"
# The dashboard's browser tests drive Debian's Chromium: Playwright's own browser download cannot
# work on a machine that reaches only package registries.
CHROMIUM = "/usr/bin/chromium"
SUBJECT = "packages/jobs-subject"

# The OpenTelemetry SDK (with its in-memory exporter) checks the optional tracing; jobs-core
# itself needs only the API, and only when installed with the ``otel`` extra.
TEST_DEPS = [
    PINS["pytest"],
    PINS["pytest-asyncio"],
    PINS["pytest-timeout"],
    PINS["hypothesis"],
    PINS["opentelemetry-sdk"],
]

# jobs-pg's tests import its framework integrations (SQLAlchemy, Django) and run the README's
# Flask and FastAPI examples, so every session collecting them installs these.
PG_FRAMEWORKS = [PINS["sqlalchemy"], PINS["django"], PINS["flask"], PINS["fastapi"], PINS["httpx"]]

nox.options.sessions = [
    "lint",
    "typecheck",
    "tests",
    "conformance-memory",
    "tests-redis",
    "conformance-redis",
    "tests-pg",
    "conformance-pg",
    "tests-webhooks",
    "tests-import-export",
    "tests-dashboard",
    "tests-subject",
    # Last, the slowest (~4 min): outages on private servers it starts, never the shared one.
    "pg-restart",
]
nox.options.reuse_existing_virtualenvs = False
nox.options.error_on_missing_interpreters = True


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """Check lint rules and formatting with ruff."""
    session.install(PINS["ruff"])
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """Type-check the library sources with mypy (strict; config in pyproject.toml)."""
    session.install(
        "-e",
        CORE,
        "-e",
        CONFORMANCE,
        PINS["mypy"],
        PINS["pytest"],
        PINS["types-croniter"],
        PINS["opentelemetry-api"],
    )
    session.install("-e", REDIS, PINS["redis"], PINS["hiredis"])
    session.install("-e", PG, *PG_FRAMEWORKS, PINS["django-stubs"])
    session.install("-e", WEBHOOKS)
    session.install("-e", IMPORT_EXPORT)
    session.install("-e", DASHBOARD)
    session.install("-e", SUBJECT)
    session.run("mypy")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Run jobs-core's tests, slow (soak and benchmark) tests and the conformance suite excluded."""
    session.install("-e", CORE, "-e", CONFORMANCE, *TEST_DEPS)
    session.run(
        "pytest", f"{CORE}/tests", "-m", "not slow and not conformance", "-q", *session.posargs
    )


@nox.session(name="conformance-memory", python=PYTHON)
def conformance_memory(session: nox.Session) -> None:
    """Run the jobs-conformance suite against the memory driver (jobs-core's tests opt in)."""
    session.install("-e", CORE, "-e", CONFORMANCE, *TEST_DEPS)
    session.run("pytest", f"{CORE}/tests", "-m", "conformance", "-q", *session.posargs)


@nox.session(name="tests-redis", python=PYTHON)
def tests_redis(session: nox.Session) -> None:
    """Run jobs-redis's own tests against the Redis server at 127.0.0.1:6379 (fails if down).

    Also the core tests that take a ``redis`` variant once jobs-redis is installed (marked
    ``redis``; the core session, without jobs-redis, never collects them).
    """
    session.install(
        "-e", CORE, "-e", CONFORMANCE, "-e", REDIS, PINS["redis"], PINS["hiredis"], *TEST_DEPS
    )
    session.run(
        "pytest", f"{REDIS}/tests", "-m", "not slow and not conformance", "-q", *session.posargs
    )
    session.run("pytest", f"{CORE}/tests", "-m", "redis and not slow", "-q", *session.posargs)


@nox.session(name="conformance-redis", python=PYTHON)
def conformance_redis(session: nox.Session) -> None:
    """Run the jobs-conformance suite against the Redis driver (its tests' conftest opts in)."""
    session.install(
        "-e", CORE, "-e", CONFORMANCE, "-e", REDIS, PINS["redis"], PINS["hiredis"], *TEST_DEPS
    )
    session.run("pytest", f"{REDIS}/tests", "-m", "conformance", "-q", *session.posargs)


@nox.session(name="cluster-redis", python=PYTHON)
def cluster_redis(session: nox.Session) -> None:
    """The jobs-conformance suite and the process tests on a private 3-master Redis Cluster.

    ``packages/jobs-redis/tests/with_cluster.py`` starts three ``redis-server --cluster-enabled
    yes`` on free loopback ports from 7101 up (temp dir, no persistence, no replicas), joins them
    with ``redis-cli --cluster create``, runs pytest with
    ``JOBS_REDIS_URL=redis+cluster://127.0.0.1:<port>`` (redis-py's ``RedisCluster``), and stops
    them. Each test's random prefix is its own hash tag, so the tests spread over the three
    masters; ``test_cluster.py`` runs three prefixes on three different masters at once. Not a
    default session (about 4 minutes on the shared 2-core machine: 3 of tests, 1 of install).
    """
    session.install(
        "-e", CORE, "-e", CONFORMANCE, "-e", REDIS, PINS["redis"], PINS["hiredis"], *TEST_DEPS
    )
    tests = f"{REDIS}/tests"
    session.run(
        "python", f"{tests}/with_cluster.py", "--",
        "pytest", tests, "-m", "conformance or processes", "-q", *session.posargs,
    )  # fmt: skip


@nox.session(name="tests-pg", python=PYTHON)
def tests_pg(session: nox.Session) -> None:
    """Run jobs-pg's own tests against PostgreSQL at 127.0.0.1:5432 (fails if it is down).

    Also the core tests that take a ``postgresql`` variant once jobs-pg is installed (marked
    ``pg``; the core session, without jobs-pg, never collects them).
    """
    session.install("-e", CORE, "-e", CONFORMANCE, "-e", PG, *PG_FRAMEWORKS, *TEST_DEPS)
    session.run(
        "pytest", f"{PG}/tests", "-m", "not slow and not conformance", "-q", *session.posargs
    )
    session.run("pytest", f"{CORE}/tests", "-m", "pg and not slow", "-q", *session.posargs)


@nox.session(name="conformance-pg", python=PYTHON)
def conformance_pg(session: nox.Session) -> None:
    """Run the jobs-conformance suite against the PostgreSQL driver, real SIGKILLs included."""
    session.install("-e", CORE, "-e", CONFORMANCE, "-e", PG, *PG_FRAMEWORKS, *TEST_DEPS)
    session.run("pytest", f"{PG}/tests", "-m", "conformance", "-q", *session.posargs)


@nox.session(name="tests-webhooks", python=PYTHON)
def tests_webhooks(session: nox.Session) -> None:
    """Run jobs-webhooks' tests (real HTTP to uvicorn servers on loopback addresses).

    They need PostgreSQL at 127.0.0.1:5432 (the pg ledger, the pg driver) and start a private
    redis-server for the outage test, stopped by the test itself.
    """
    session.install(
        "-e",
        CORE,
        "-e",
        PG,
        "-e",
        REDIS,
        "-e",
        WEBHOOKS,
        PINS["redis"],
        PINS["hiredis"],
        PINS["uvicorn"],
        PINS["standardwebhooks"],
        PINS["fastapi"],
        *TEST_DEPS,
    )
    session.run("pytest", f"{WEBHOOKS}/tests", "-m", "not slow", "-q", *session.posargs)


@nox.session(name="tests-import-export", python=PYTHON)
def tests_import_export(session: nox.Session) -> None:
    """Run jobs-import-export's tests (S3 on a local moto server, the SIGKILL test on PostgreSQL).

    The tests start a moto S3 server (``moto[server]``) on a free 127.0.0.1 port and reach it over
    HTTP; the SIGKILL test's workers use PostgreSQL at 127.0.0.1:5432 (fails if it is down).
    """
    session.install("-e", CORE, "-e", PG, "-e", IMPORT_EXPORT, PINS["moto"], *TEST_DEPS)
    session.run("pytest", f"{IMPORT_EXPORT}/tests", "-m", "not slow", "-q", *session.posargs)


@nox.session(name="tests-dashboard", python=PYTHON)
def tests_dashboard(session: nox.Session) -> None:
    """Run jobs-dashboard's tests: HTTP and Playwright-driven Chromium over PostgreSQL and Redis.

    Needs Debian's Chromium at /usr/bin/chromium (installed here with apt-get when missing and
    running as root, as CI does). Screenshots of every page land in
    ``.nox/tests-dashboard/screenshots``.
    """
    import os
    from pathlib import Path

    if not Path(CHROMIUM).exists():
        if os.geteuid() != 0:
            session.error(f"no {CHROMIUM}: sudo apt-get install -y chromium")
        session.run("apt-get", "update", "-qq", external=True)
        session.run("apt-get", "install", "-y", "-qq", "chromium", external=True)
    session.install(
        "-e", CORE, "-e", CONFORMANCE, "-e", PG, "-e", REDIS, "-e", DASHBOARD,
        PINS["redis"], PINS["hiredis"], PINS["httpx"], PINS["playwright"], *TEST_DEPS,
    )  # fmt: skip
    shots = Path(session.virtualenv.location) / "screenshots"
    session.run(
        "pytest",
        f"{DASHBOARD}/tests",
        "-q",
        *session.posargs,
        env={"JOBS_DASHBOARD_SCREENSHOTS": str(shots)},
    )
    session.log(f"screenshots: {shots}")


@nox.session(name="tests-subject", python=PYTHON)
def tests_subject(session: nox.Session) -> None:
    """Run jobs-subject's tests on PostgreSQL at 127.0.0.1:5432 (fails if it is down).

    Each test makes its own app and jobs schemas; the SIGKILL tests start ``jobsctl worker``
    processes on them.
    """
    session.install("-e", CORE, "-e", PG, "-e", IMPORT_EXPORT, "-e", SUBJECT, *TEST_DEPS)
    session.run("pytest", f"{SUBJECT}/tests", "-m", "not slow", "-q", *session.posargs)


@nox.session(name="pg-restart", python=PYTHON)
def pg_restart(session: nox.Session) -> None:
    """Outages under a running worker (jobs-pg's ``slow`` tests): restart, read-only, failover.

    Each test starts PRIVATE PostgreSQL servers (initdb into a temp dir, pg_ctl on a free
    loopback port, a pg_basebackup replica, as the ``postgres`` OS user under root) and a TCP
    proxy, and removes them; the shared server at 127.0.0.1:5432 is never touched.
    """
    session.install("-e", CORE, "-e", CONFORMANCE, "-e", PG, *PG_FRAMEWORKS, *TEST_DEPS)
    session.run("pytest", f"{PG}/tests", "-m", "slow and not soak", "-q", *session.posargs)


@nox.session(name="outbox-soak", python=PYTHON)
def outbox_soak(session: nox.Session) -> None:
    """The 10,000-row outbox soak: two ``jobsctl relay`` processes, one SIGKILLed every 2 s.

    Not a default session (about a minute); the default ``tests-pg`` runs its 1,500-row form.
    """
    session.install("-e", CORE, "-e", CONFORMANCE, "-e", PG, *TEST_DEPS)
    session.run(
        "pytest", f"{PG}/tests/test_outbox_soak.py", "-m", "soak", "-q", "-s", *session.posargs
    )


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """Run the jobs-core demo on the memory driver."""
    session.install("-e", CORE)
    session.run("jobsctl", "demo", *session.posargs)


# The benchmark session (issue 8): never in the default sessions, and the only place the peer
# libraries are installed, so no test session can import one by accident.
BENCH_PINS = {
    "psycopg": "psycopg[binary]==3.3.9",
    "redis": "redis==8.1.0",
    "hiredis": "hiredis==3.5.0",
    "pyinstrument": "pyinstrument==5.1.3",
    "uvicorn": "uvicorn==0.54.0",
    # uvicorn's fast HTTP parser, as `uvicorn[standard]` installs it in production.
    "httptools": "httptools==0.9.0",
}
BENCH_ARQ = "arq==0.28.0"
BENCH_PEERS = [
    "procrastinate==3.10.0",
    "pgqueuer[asyncpg]==1.6.0",
    "asyncpg==0.32.0",
    "dbos==3.4.0",
    "rq==3.0.0",
    "dramatiq[redis]==2.2.1",
]


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Run the benchmarks in bench/ (``nox -s bench -- --quick``; ``--peers`` adds the peers).

    Installs jobs-core and, when their packages exist, jobs-pg, jobs-redis, jobs-webhooks,
    jobs-import-export and jobs-dashboard (editable), the floors' clients, uvicorn, httpx and the
    profiler; the pinned peers only when ``--peers`` is passed. ``--webhooks`` runs the webhook
    figures instead (bench/webhooks.py), ``--import-export`` the import/export ones
    (bench/import_export.py), ``--dashboard`` the dashboard's (bench/dashboard.py),
    ``--timers`` the lateness of delayed jobs (bench/timers.py), ``--soak MINUTES`` enqueue and
    processing at once with the retention sweep (bench/soak.py; ``--private-server`` runs it on
    a fresh server at PostgreSQL's defaults, autovacuum on, which the shared one has off).
    """
    from pathlib import Path

    packages = ["-e", CORE]
    for sibling in ("packages/jobs-pg", "packages/jobs-redis", WEBHOOKS, IMPORT_EXPORT, DASHBOARD):
        if (Path(sibling) / "pyproject.toml").exists():
            packages += ["-e", sibling]
    session.install(*packages, *BENCH_PINS.values(), PINS["httpx"])
    if "--peers" in session.posargs:
        session.install(*BENCH_PEERS)
        # arq 0.28.0 pins redis<6 while jobs-redis needs redis 8: installing it with its deps
        # would downgrade the client under our driver. It runs on redis-py 8 (checked by the
        # bench run itself: its figures verify counts in Redis).
        session.install("--no-deps", BENCH_ARQ, "click==8.5.1")
    session.run("python", "-m", "bench", *session.posargs)
