"""The ``jobsctl`` command: the demo, a worker's start/drain/exit, its errors, and plugins."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from jobs_core import REGISTRY, cli, job, use_driver
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.logs import LineHandler, LogFormat

JOBS = [sys.executable, "-m", "jobs_core.cli"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "COLUMNS")}
    env["NO_COLOR"] = "1"
    return env


def _jobs(
    *args: str, cwd: Path | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*JOBS, *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_the_console_script_is_jobsctl_and_no_script_named_jobs_is_installed() -> None:
    """Every POSIX shell has a ``jobs`` builtin that would swallow ``jobs worker ...``."""
    scripts = Path(sys.executable).parent
    jobsctl = scripts / "jobsctl"
    assert jobsctl.exists(), f"no jobsctl console script beside {sys.executable}"
    assert not (scripts / "jobs").exists()

    top = subprocess.run(
        [str(jobsctl), "--help"], env=_env(), capture_output=True, text=True, timeout=30
    )
    worker = subprocess.run(
        [str(jobsctl), "worker", "--help"], env=_env(), capture_output=True, text=True, timeout=30
    )
    module = subprocess.run(
        [sys.executable, "-m", "jobs_core", "--help"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert top.returncode == 0, top.stderr
    assert "Usage: jobsctl" in top.stdout
    assert "worker" in top.stdout
    assert worker.returncode == 0, worker.stderr
    assert "Usage: jobsctl worker" in worker.stdout
    assert "--driver" in worker.stdout
    assert module.returncode == 0, module.stderr
    assert "Usage: jobsctl" in module.stdout


def test_demo_runs_the_whole_story_and_exits_0_quickly() -> None:
    started = time.monotonic()
    done = _jobs("demo")
    elapsed = time.monotonic() - started

    assert done.returncode == 0, done.stdout + done.stderr
    assert elapsed < 30
    out = done.stdout
    for expected in (
        # Every job, and the state the outcome table reads back for it.
        "checkout A-1001",
        "checkout A-1002",
        "checkout B-2001",
        "welcome ada@acme.test",
        "done",
        "dead",
        # What happened on the way, narrated from the library's own records.
        "enqueued again",
        "deduped=True",
        "replayed from storage, not called again",
        "→ retried",
        "→ suspended",
        "parked until",
        "compensate:charge: compensation ran (refund_charge)",
        "→ dead-lettered",
        "X_SHOP_UNDELIVERABLE",
        "once: 'started' was stored first",
        # The backfill's progress bar, page by page, and the skipped second pass.
        "batch:0 ██",
        "████████████████████ 40/40 rows",
        "→ skipped: the ledger holds the completed pass",
        # The ledger and the verdict.
        "refund",
        "payout",
        "checks held",
    ):
        assert expected in out, f"{expected!r} missing from the demo's output:\n{out}"
    assert not [line for line in out.splitlines() if line.startswith("✗")]


TINY_APP = """
    from pathlib import Path

    from pydantic import BaseModel

    from jobs_core import CancelSignal, job


    class Note(BaseModel):
        path: str
        text: str


    @job(input=Note, idempotency_key=lambda n: n.path, tenant="none")
    async def write_note(note, step, ctx):
        await step.run("write", lambda: Path(note.path).write_text(note.text))


    async def wait_for_cancel(cancel: CancelSignal) -> None:
        await cancel.wait()
        cancel.raise_if_cancelled()


    @job(input=Note, idempotency_key=lambda n: n.path, tenant="none", queue="slow")
    async def block(note, step, ctx):
        await step.run("started", lambda: Path(note.path).write_text(note.text))
        await step.run("block", wait_for_cancel)


    # The CLI installs the driver before it imports APP, so import-time enqueues are served.
    write_note.enqueue_sync(Note(path="note.txt", text="hello"))
    block.enqueue_sync(Note(path="started.txt", text="go"))
"""


@pytest.fixture
def tiny_app(tmp_path: Path) -> Path:
    (tmp_path / "tinyapp.py").write_text(textwrap.dedent(TINY_APP))
    return tmp_path


def _wait_for(paths: list[Path], proc: subprocess.Popen[str], budget: float = 15) -> None:
    deadline = time.monotonic() + budget
    while not all(p.exists() for p in paths):
        if proc.poll() is not None:
            pytest.fail(f"the worker exited early ({proc.returncode}): {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no {paths} after {budget} s: {proc.communicate()}")
        time.sleep(0.02)


def _serve_tiny_app_then_sigterm(tiny_app: Path, *args: str) -> tuple[int, str]:
    """Run ``jobsctl ARGS`` on tiny_app until both its jobs ran, SIGTERM it; answer (rc, stderr)."""
    proc = subprocess.Popen(
        [*JOBS, *args],
        cwd=tiny_app,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for([tiny_app / "note.txt", tiny_app / "started.txt"], proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err


@pytest.mark.parametrize("command", ["worker", "dev"])
def test_worker_runs_app_jobs_and_drains_on_sigterm(tiny_app: Path, command: str) -> None:
    code, err = _serve_tiny_app_then_sigterm(
        tiny_app, command, "tinyapp", "--driver", "memory://", "--drain-timeout", "5s"
    )

    assert code == 0, err
    assert (tiny_app / "note.txt").read_text() == "hello"
    assert "jobs.worker.started" in err
    assert "queues=default,slow" in err
    assert "job=tinyapp.write_note" in err and "outcome=completed" in err
    # The blocked body is running; write_note's may still be between its last line and its
    # completion when the signal lands (its file exists a moment before), so 1 or 2.
    assert re.search(r"jobs\.worker\.draining signal=SIGTERM in_flight=[12] ", err), err
    # The blocked body honoured its cancel signal: handed back, its attempt not spent.
    assert "job=tinyapp.block" in err and "outcome=interrupted" in err
    assert "jobs.worker.stopped" in err
    assert err.index("jobs.worker.draining") < err.index("jobs.worker.stopped")


def test_worker_names_an_app_that_does_not_import(tmp_path: Path) -> None:
    done = _jobs("worker", "no_such_app.jobs", "--driver", "memory://", cwd=tmp_path)

    assert done.returncode == 2
    assert "'no_such_app.jobs' is not an importable module" in done.stderr
    assert "ModuleNotFoundError" in done.stderr
    assert "fix: pass the dotted module path" in done.stderr


def test_worker_given_a_file_names_the_module_to_pass(tiny_app: Path) -> None:
    done = _jobs("worker", "tinyapp.py", "--driver", "memory://", cwd=tiny_app)

    assert done.returncode == 2
    assert "fix: APP is a module path, not a file: pass 'tinyapp'" in done.stderr


def test_worker_shows_where_an_app_raised_on_import(tmp_path: Path) -> None:
    (tmp_path / "brokenapp.py").write_text("import json\n\nraise RuntimeError('boom')\n")

    done = _jobs("worker", "brokenapp", "--driver", "memory://", cwd=tmp_path)

    assert done.returncode == 2
    assert "importing APP 'brokenapp' failed" in done.stderr
    assert 'brokenapp.py", line 3' in done.stderr
    assert "RuntimeError: boom" in done.stderr
    assert "importlib" not in done.stderr


def test_worker_prints_code_and_fix_of_a_declaration_error(tmp_path: Path) -> None:
    (tmp_path / "badjob.py").write_text(
        "from jobs_core import job\n\n@job(input=int, tenant='none')\n"
        "async def f(i, step, ctx): ...\n"
    )

    done = _jobs("worker", "badjob", "--driver", "memory://", cwd=tmp_path)

    assert done.returncode == 2
    assert "X_IDEMPOTENCY_REQUIRED" in done.stderr
    assert "fix: Pass idempotency_key=" in done.stderr


def test_an_unknown_url_scheme_names_the_extra_of_every_known_scheme(tiny_app: Path) -> None:
    """The fix names each known scheme's install, not only Postgres's; no password is shown."""
    served = _jobs("worker", "tinyapp", "--driver", "nosuch://host", cwd=tiny_app)
    listed = _jobs("ls", "--driver", "mysql://app:hunter2@db/app")

    for done, scheme in ((served, "nosuch://"), (listed, "mysql://")):
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("error X_DRIVER_UNKNOWN"), done.stderr
        assert f"no driver for '{scheme}'" in done.stderr
        assert "the drivers installed are memory" in done.stderr
        fix = done.stderr.split("fix: ", 1)[1]
        for named in ("'jobs-core[pg]' for postgresql://", "'jobs-core[redis]' for redis://"):
            assert named in fix, fix
        assert "memory:// is built in" in fix
        assert "Traceback" not in done.stderr
    assert "hunter2" not in listed.stderr
    assert "mysql://app:***@db/app" in listed.stderr


def test_worker_refuses_a_bad_duration_option(tiny_app: Path) -> None:
    done = _jobs(
        "worker", "tinyapp", "--driver", "memory://", "--visibility-timeout", "0s", cwd=tiny_app
    )

    assert done.returncode == 2
    assert "X_JOB_OPTIONS_INVALID" in done.stderr
    assert "visibility_timeout" in done.stderr


def test_enqueue_without_an_app_says_no_module_declares_any_job() -> None:
    done = _jobs("enqueue", "billing.charge", "--input", "{}", "--driver", "memory://")

    assert done.returncode == 2
    assert "X_JOB_UNKNOWN" in done.stderr
    assert "no --app module declares any job" in done.stderr
    assert "--app MODULE" in done.stderr


def test_worker_refuses_a_bad_cancel_grace(tiny_app: Path) -> None:
    done = _jobs(
        "worker", "tinyapp", "--driver", "memory://", "--cancel-grace", "soon", cwd=tiny_app
    )

    assert done.returncode == 2
    assert "X_JOB_OPTIONS_INVALID" in done.stderr
    assert "cancel_grace" in done.stderr


async def test_the_cancel_grace_option_reaches_the_worker() -> None:
    """A body deaf to an operator cancel has its task cancelled after --cancel-grace, not 5 s."""
    driver = MemoryDriver()
    started = asyncio.Event()
    ended: list[float] = []

    @job(input=int, idempotency_key=lambda i: str(i), tenant="none", name="cli.deaf", queue="deaf")
    async def deaf(input: int, step: Any, ctx: Any) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        finally:
            ended.append(time.monotonic())

    try:
        with use_driver(driver):
            result = await deaf.enqueue(1)
        serving = asyncio.create_task(
            cli._serve(
                driver,
                queues=["deaf"],
                concurrency=1,
                visibility_timeout="600ms",
                drain_timeout="2s",
                cancel_grace="150ms",
            )
        )
        await asyncio.wait_for(started.wait(), 10)
        cancelled_at = time.monotonic()
        await driver.introspect.cancel(result.id, "stopped by the test")
        for _ in range(400):
            if ended:
                break
            await asyncio.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(serving, 10)
    finally:
        REGISTRY.unregister("cli.deaf")

    assert ended, "the deaf body was never cancelled"
    # The heartbeat (a third of the 600 ms lease) fires the cancel, then the 150 ms grace runs.
    assert 0.15 <= ended[0] - cancelled_at < 2.0


HELLO_PLUGIN = """
    import typer


    def register(app: typer.Typer) -> None:
        @app.command("hello")
        def hello() -> None:
            \"\"\"Say hello.\"\"\"
            typer.echo("hello from a plugin")
"""


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "hello_plugin.py").write_text(textwrap.dedent(HELLO_PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = [
        EntryPoint("hello", "hello_plugin:register", cli.ENTRY_POINT_GROUP),
        EntryPoint("pg", "jobs_pg_not_installed.cli:register", cli.ENTRY_POINT_GROUP),
    ]
    monkeypatch.setattr(cli, "entry_points", lambda group: [ep for ep in eps if ep.group == group])


def test_plugins_add_commands_and_a_broken_one_explains_itself(plugins: None) -> None:
    app = cli.create_app()
    runner = CliRunner()

    hello = runner.invoke(app, ["hello"])
    assert hello.exit_code == 0
    assert "hello from a plugin" in hello.output

    broken = runner.invoke(app, ["pg", "migrate"])
    assert broken.exit_code == 2
    assert "the 'pg' commands" in broken.output
    assert "failed to load: ModuleNotFoundError" in broken.output

    listing = runner.invoke(app, ["--help"])
    assert listing.exit_code == 0
    assert "hello" in listing.output
    assert "Unavailable" in listing.output


def test_broken_plugin_does_not_stop_the_builtin_commands(plugins: None) -> None:
    done = CliRunner().invoke(cli.create_app(), ["worker", "--help"])

    assert done.exit_code == 0
    assert "--visibility-timeout" in done.output


def _record(**fields: object) -> logging.LogRecord:
    record = logging.LogRecord(
        "jobs.worker", logging.ERROR, __file__, 1, "jobs.lease.lost", None, None
    )
    record.__dict__.update(fields)
    return record


def test_log_lines_show_the_event_and_its_fields_as_text_or_json() -> None:
    fields = {"event": "jobs.lease.lost", "job": "shop.checkout", "queues": ["a", "b"]}
    record = _record(**fields, note="two words", ids={"run": "r1"})

    text = LineHandler(io.StringIO(), LogFormat.TEXT, color=False).render(record)
    line = json.loads(LineHandler(io.StringIO(), LogFormat.JSON).render(record))

    assert re.fullmatch(
        r"\d\d:\d\d:\d\d\.\d{3} ERROR   jobs\.lease\.lost job=shop\.checkout queues=a,b "
        r"note='two words' ids=\{\"run\":\"r1\"\}",
        text,
    ), text
    assert line["level"] == "error" and line["event"] == "jobs.lease.lost"
    assert line["logger"] == "jobs.worker" and line["ts"].endswith("Z")
    assert (line["job"], line["queues"], line["note"]) == ("shop.checkout", ["a", "b"], "two words")
    assert "message" not in line  # the message is the event
    colored = LineHandler(io.StringIO(), LogFormat.TEXT, color=True).render(record)
    assert "\x1b[1;36mjobs.lease.lost\x1b[0m" in colored


def test_a_worker_logs_json_lines_with_log_format_json(tiny_app: Path) -> None:
    code, err = _serve_tiny_app_then_sigterm(
        tiny_app, "worker", "tinyapp", "--driver", "memory://", "--log-format", "json"
    )

    assert code == 0, err
    lines = [json.loads(line) for line in err.splitlines()]
    events = [line["event"] for line in lines]
    assert events[0] == "jobs.worker.started" and events[-1] == "jobs.worker.stopped"
    settled = [line for line in lines if line["event"] == "jobs.attempt.settled"]
    outcomes = {line["job"]: line["outcome"] for line in settled}
    assert outcomes == {"tinyapp.write_note": "completed", "tinyapp.block": "interrupted"}
