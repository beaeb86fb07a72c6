"""The distribution's seams: the ``jobs.factories`` entry points ``jobsctl manifest`` lists, and a
declared import/export job in the manifest."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import jobs_import_export


def test_the_factories_are_registered_under_jobs_factories() -> None:
    found = {ep.name: ep for ep in entry_points(group="jobs.factories")}
    assert found["export_rows"].load() is jobs_import_export.export_rows
    assert found["import_rows"].load() is jobs_import_export.import_rows


def test_jobsctl_manifest_lists_both_factories_and_a_declared_import(tmp_path: Path) -> None:
    apps = Path(__file__).parent / "apps"
    answer = subprocess.run(
        [sys.executable, "-m", "jobs_core", "manifest", "ie_kill_app", "--json"],
        env={"PYTHONPATH": str(apps), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    entries = json.loads(answer.stdout)
    factories = {(e["name"], e["distribution"]) for e in entries if e["kind"] == "factory"}
    assert {
        ("export_rows", "jobs-import-export"),
        ("import_rows", "jobs-import-export"),
    } <= factories
    [declared] = [e for e in entries if e["kind"] == "job" and e["name"] == "ie.kill.import"]
    assert declared["tenant"] == "none"


def test_the_readmes_first_example_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S)
    promised = re.search(r"It prints:\n\n```\n(.*?)```", readme, re.S)
    assert code is not None and promised is not None
    (tmp_path / "orders_demo.py").write_text(code.group(1))
    answer = subprocess.run(
        [sys.executable, "orders_demo.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    printed = re.sub(r"errors/acme/[0-9a-f-]{36}", "errors/acme/<run id>", answer.stdout)
    assert printed == promised.group(1)
    errors = list((tmp_path / "imports/errors/acme").glob("*/errors-00000.ndjson"))
    assert [json.loads(line) for line in errors[0].read_text().splitlines()] == [
        {"line": 3, "field": "total", "code": "decimal_parsing"}
    ]
