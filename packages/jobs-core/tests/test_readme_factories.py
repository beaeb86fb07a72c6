"""The README's Factories section: every runnable example runs as written and prints what its
comments say."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _examples() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Factories\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return [block for block in blocks if "asyncio.run(main())" in block]


def test_every_runnable_factory_example_prints_what_it_says() -> None:
    examples = _examples()
    assert len(examples) == 3, "backfill, purge and consumer"
    for code in examples:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        promised = [
            line.split("# ", 1)[1].strip()
            for line in code.splitlines()
            if "print(" in line and "# " in line
        ]
        promised += [
            line.strip().removeprefix("# ")
            for line in code.splitlines()
            if line.strip().startswith("# {")
        ]
        printed = done.stdout.splitlines()
        assert promised and len(printed) >= len(promised), done.stdout
        for want in promised:
            assert want in printed, (want, done.stdout)
