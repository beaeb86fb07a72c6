"""The distribution: its entry points reach `jobsctl manifest`, and its README example runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import jobs_webhooks

README = Path(__file__).parents[1] / "README.md"


def test_the_factories_are_registered_and_listed_by_jobsctl_manifest() -> None:
    found = {ep.name: ep.value for ep in entry_points(group="jobs.factories")}
    assert found["webhook"] == "jobs_webhooks:webhook"
    assert found["webhook_receiver"] == "jobs_webhooks:webhook_receiver"
    out = subprocess.run(
        [sys.executable, "-m", "jobs_core", "manifest", "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    listed = {e["name"]: e for e in json.loads(out.stdout) if e["kind"] == "factory"}
    assert listed["webhook"]["distribution"] == "jobs-webhooks"
    assert listed["webhook_receiver"]["value"] == "jobs_webhooks:webhook_receiver"


def test_every_public_name_resolves() -> None:
    for name in jobs_webhooks.__all__:
        assert getattr(jobs_webhooks, name) is not None, name


def test_the_readme_example_runs(tmp_path: Path) -> None:
    code = re.search(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert code is not None
    script = tmp_path / "example.py"
    script.write_text(code.group(1), encoding="utf-8")
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=True, timeout=60
    )
    assert "received evt_1 {'type': 'orders.paid', 'data': {'order': 42}}" in out.stdout
    assert "ledger: [('delivered', 200)]" in out.stdout
