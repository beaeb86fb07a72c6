"""``jobsctl scheduler`` and ``jobsctl dev`` with cron tasks, run as real subprocesses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

JOBS = [sys.executable, "-m", "jobs_core.cli"]

TASK_APP = """
    import asyncio
    from datetime import UTC, datetime, timedelta
    from pathlib import Path

    from pydantic import BaseModel

    from jobs_core import current_driver, job, task


    class Stamp(BaseModel):
        at: datetime


    @job(input=Stamp, idempotency_key=lambda s: s.at.isoformat(), tenant="none")
    async def stamp(s, step, ctx):
        await step.run("write", lambda: Path("fired.txt").write_text(s.at.isoformat()))


    minutely = task(
        cron="* * * * *", tz="UTC", enqueue=lambda at: [(stamp, {"at": at})], name="minutely"
    )

    # As if the task last fired two minutes ago: the scheduler has an occurrence to catch up at
    # once instead of waiting for the next minute. (The CLI installs the driver before import.)
    asyncio.run(
        current_driver().scheduler_state.advance(
            "minutely", None, datetime.now(UTC) - timedelta(minutes=2)
        )
    )
"""


@pytest.fixture
def task_app(tmp_path: Path) -> Path:
    (tmp_path / "taskapp.py").write_text(textwrap.dedent(TASK_APP))
    (tmp_path / "plainapp.py").write_text("X = 1\n")
    return tmp_path


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "COLUMNS")}
    env["NO_COLOR"] = "1"
    return env


class Running:
    """A ``jobsctl`` subprocess whose stderr is collected by a thread, so waits can time out."""

    def __init__(self, *args: str, cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [*JOBS, *args],
            cwd=cwd,
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    @property
    def err(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, budget: float = 20) -> None:
        deadline = time.monotonic() + budget
        while text not in self.err:
            if self.proc.poll() is not None:
                self._reader.join(5)
                pytest.fail(f"exited ({self.proc.returncode}) before {text!r}:\n{self.err}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {text!r} after {budget} s:\n{self.err}")
            time.sleep(0.02)

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        return code


def test_scheduler_fires_the_apps_tasks_and_releases_the_lease_on_sigterm(task_app: Path) -> None:
    run = Running("scheduler", "taskapp", "--driver", "memory://", cwd=task_app)
    run.wait_for("jobs.task.fired")
    code = run.terminate()

    err = run.err
    assert code == 0, err
    assert "jobs.scheduler.started" in err and "tasks=minutely" in err
    assert "jobs.scheduler.leader-acquired" in err
    assert "task=minutely" in err
    assert err.index("jobs.scheduler.leader-released") < err.index("jobs.scheduler.stopped")


def test_dev_runs_the_scheduler_beside_the_worker(task_app: Path) -> None:
    run = Running("dev", "taskapp", cwd=task_app)
    deadline = time.monotonic() + 20
    while not (task_app / "fired.txt").exists():
        assert run.proc.poll() is None, run.err
        assert time.monotonic() < deadline, run.err
        time.sleep(0.02)
    code = run.terminate()

    err = run.err
    assert code == 0, err
    # The scheduler fired the caught-up occurrence; the worker in the same process ran it.
    assert "jobs.task.fired" in err
    assert "job=taskapp.stamp" in err and "outcome=completed" in err
    assert "jobs.scheduler.leader-released" in err


def test_scheduler_refuses_an_app_without_tasks(task_app: Path) -> None:
    done = subprocess.run(
        [*JOBS, "scheduler", "plainapp", "--driver", "memory://"],
        cwd=task_app,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert "declares no tasks" in done.stderr


def test_scheduler_refuses_a_bad_leader_ttl(task_app: Path) -> None:
    done = subprocess.run(
        [*JOBS, "scheduler", "taskapp", "--driver", "memory://", "--leader-ttl", "soon"],
        cwd=task_app,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert "X_JOB_OPTIONS_INVALID" in done.stderr
    assert "leader_ttl" in done.stderr
