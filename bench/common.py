"""Shared plumbing: backends, child processes, clocks, RSS, statistics.

Every figure runs in a child process of its own (``python -m bench.child FIGURE ...``) that prints
one ``BENCH_RESULT {json}`` line; the orchestrator never times anything in its own process, so an
import or a warm cache in one figure never helps the next.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

PG_HOST = os.environ.get("BENCH_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("BENCH_PG_PORT", "5432"))
PG_USER = os.environ.get("BENCH_PG_USER", "postgres")
REDIS_HOST = os.environ.get("BENCH_REDIS_HOST", "127.0.0.1")
REDIS_PORT = int(os.environ.get("BENCH_REDIS_PORT", "6379"))

# One database (Postgres) or db index (Redis) per system, so no system ever sees another's rows.
# Indexes 0-9 are left to the test suites.
REDIS_DB = {
    "ours": 10,
    "floor": 11,
    "arq": 12,
    "rq": 13,
    "dramatiq": 14,
}

RESULT_TAG = "BENCH_RESULT "
READY_TAG = "BENCH_READY"


def pg_url(database: str) -> str:
    """Answer the libpq URL of ``database`` on the bench server."""
    return f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{database}"


def redis_url(system: str) -> str:
    """Answer the Redis URL of ``system``'s own db index."""
    return f"redis://{REDIS_HOST}:{REDIS_PORT}/{REDIS_DB[system]}"


def pg_admin(sql: str) -> None:
    """Run one statement in autocommit on the ``postgres`` database."""
    import psycopg

    with psycopg.connect(pg_url("postgres"), autocommit=True) as conn:
        conn.execute(sql)


def fresh_database(name: str) -> str:
    """Drop and create ``name`` (terminating its sessions first); answer its URL."""
    assert name.startswith("bench_"), name  # never touch anything the harness did not create
    drop_database(name)
    pg_admin(f'CREATE DATABASE "{name}"')
    return pg_url(name)


def drop_database(name: str) -> None:
    """Drop ``name`` if it exists, forcing its sessions out."""
    assert name.startswith("bench_"), name
    pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


_POLL_CONNECTIONS: dict[str, Any] = {}


def pg_count(url: str, sql: str, params: Sequence[Any] = ()) -> int:
    """Answer the integer ``sql`` selects, on one autocommit connection per ``url`` kept open.

    The orchestrator's count polls run every 10 ms while a worker drains: a connection each
    would start a server backend each (a fork and its start-up, on the cores the systems being
    measured run on). :func:`close_pg_counts` closes them, which also flushes their statistics
    before :func:`pg_commits` reads the database's count.
    """
    import psycopg

    kept = _POLL_CONNECTIONS.get(url)
    if kept is not None:
        try:
            return _first_int(kept.execute(sql, params).fetchone())
        except psycopg.OperationalError:  # the database was dropped and made again since
            kept.close()
    fresh = _POLL_CONNECTIONS[url] = psycopg.connect(url, autocommit=True)
    return _first_int(fresh.execute(sql, params).fetchone())


def _first_int(row: Any) -> int:
    return int(row[0]) if row and row[0] is not None else 0


def close_pg_counts() -> None:
    """Close every connection :func:`pg_count` keeps open."""
    while _POLL_CONNECTIONS:
        _POLL_CONNECTIONS.popitem()[1].close()


def pg_commits(database: str) -> int:
    """Answer the transactions ``database`` has committed (``pg_stat_database.xact_commit``).

    Read it after the processes being measured exited: a backend flushes its counts on exit, so
    nothing is left pending. Read-only transactions (a count poll) count too.
    """
    import psycopg

    close_pg_counts()
    time.sleep(0.3)  # let exiting backends flush their statistics
    with psycopg.connect(pg_url("postgres"), autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (database,)
        ).fetchone()
    return int(row[0]) if row else 0


def flush_redis(system: str) -> str:
    """Empty ``system``'s own db index; answer its URL."""
    import redis

    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=REDIS_DB[system])
    client.flushdb()
    client.close()
    return redis_url(system)


def rss_kib(pid: int | str = "self") -> int:
    """Answer a process's resident set size in KiB, from ``/proc/<pid>/status``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def median(values: Sequence[float]) -> float:
    """Answer the median of ``values``."""
    return float(statistics.median(values))


def percentile(values: Sequence[float], q: float) -> float:
    """Answer the ``q`` percentile (0..100) by the nearest-rank method."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def emit(result: dict[str, Any]) -> None:
    """Print a child's result line (the only line the orchestrator reads)."""
    print(RESULT_TAG + json.dumps(result), flush=True)


def ready() -> None:
    """Tell the orchestrator this child is up and idle."""
    print(READY_TAG, flush=True)


class ChildFailed(RuntimeError):
    """A child exited without a result."""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONHASHSEED", "0")
    return env


def child_env() -> dict[str, str]:
    """Answer the environment every child and peer CLI runs with."""
    return _env()


def child_argv(name: str, kwargs: dict[str, Any]) -> list[str]:
    """Answer the command line of the child running workload ``name`` with ``kwargs``."""
    return [sys.executable, "-m", "bench.child", name, json.dumps(kwargs)]


def run_child(name: str, kwargs: dict[str, Any], *, timeout: float = 600) -> dict[str, Any]:
    """Run workload ``name`` in a child process to completion; answer its result.

    Raises:
        ChildFailed: no result line (its stderr tail is in the message).
    """
    args = child_argv(name, kwargs)
    try:
        proc = subprocess.run(
            args,
            cwd=ROOT,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        tail = "\n".join(err.splitlines()[-25:])
        raise ChildFailed(f"child {name} timed out after {timeout:.0f} s:\n{tail}") from None
    return _result_of(proc.stdout, proc.stderr, proc.returncode, args)


def _result_of(stdout: str, stderr: str, code: int | None, args: Sequence[str]) -> dict[str, Any]:
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG) :])  # type: ignore[no-any-return]
    lines = stderr.splitlines()
    tail = "\n".join(lines[-25:])
    last = next((line.strip() for line in reversed(lines) if line.strip()), "")
    what = " ".join(args[3:4]) or " ".join(args)
    raise ChildFailed(f"child {what} exited {code} with no result ({last[:200]}):\n{tail}")


class Background:
    """A child started now and read later (a worker the orchestrator feeds from elsewhere)."""

    def __init__(self, argv: Sequence[str], *, cwd: Path = ROOT, tag: str = "child") -> None:
        """Start ``argv`` with stdout piped and stderr in a temporary file."""
        self.argv = list(argv)
        self._err = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in finish()
            mode="w+", prefix=f"bench-{tag}-", suffix=".log", delete=False
        )
        self.proc = subprocess.Popen(
            self.argv,
            cwd=cwd,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        """The child's pid."""
        return self.proc.pid

    def wait_ready(self, timeout: float = 60) -> None:
        """Block until the child prints ``BENCH_READY``.

        Raises:
            ChildFailed: the child exited first or stayed silent past ``timeout``.
        """
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.strip() == READY_TAG:
                return
        self.terminate()
        raise ChildFailed(f"{' '.join(self.argv)} never became ready:\n{self.stderr_tail()}")

    def finish(self, timeout: float = 900) -> dict[str, Any]:
        """Wait for the child's exit and answer its result."""
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.terminate()
            raise ChildFailed(f"{' '.join(self.argv)} timed out:\n{self.stderr_tail()}") from None
        return _result_of(out, self.stderr_tail(), self.proc.returncode, self.argv)

    def terminate(self, grace: float = 10) -> None:
        """SIGTERM the child (its own process group), SIGKILL after ``grace`` seconds."""
        if self.proc.poll() is not None:
            return
        import signal

        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass

    def stderr_tail(self, lines: int = 25) -> str:
        """Answer the last ``lines`` lines of the child's stderr."""
        self._err.flush()
        text = Path(self._err.name).read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])


POLLS = [0]
"""How many probes :func:`poll_until` made (each one may be a committed read on the backend)."""


def poll_until(
    probe: Callable[[], int], target: int, *, timeout: float, interval: float = 0.01
) -> float:
    """Call ``probe`` every ``interval`` s until it answers ``>= target``; answer ``time.time()``.

    Raises:
        TimeoutError: the count stayed below ``target`` for ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    last = -1
    while True:
        POLLS[0] += 1
        last = probe()
        if last >= target:
            return time.time()
        if time.monotonic() > deadline:
            raise TimeoutError(f"count reached {last} of {target} in {timeout:.0f} s")
        time.sleep(interval)


def mark_file() -> Path:
    """Answer a fresh path a body writes its first-start timestamp (or latencies) into."""
    fd, name = tempfile.mkstemp(prefix="bench-mark-")
    os.close(fd)
    os.unlink(name)
    return Path(name)


def read_first_ns(path: Path) -> int:
    """Answer the earliest ``time.time_ns()`` any process wrote into ``path`` (one per line)."""
    return min(int(x) for x in path.read_text().split())
