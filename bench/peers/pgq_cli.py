"""``pgq`` with one fix: its ``--log-level`` reaches the logger setup as text under typer 0.29.

pgqueuer 1.6.0's ``run`` command declares ``--log-level`` with a ``parser=`` that answers a
string, and typer 0.29 (the version jobs-core pins, so the bench session has it) hands that string
on instead of the enum, so every ``pgq run`` fails in ``setup_fancy_logger``. This wrapper turns
the text back into the enum and otherwise runs pgqueuer's own CLI unchanged.
"""

from __future__ import annotations

from typing import Any

from pgqueuer.core import logconfig

_setup = logconfig.setup_fancy_logger


def _setup_any(level: Any) -> None:
    _setup(level if isinstance(level, logconfig.LogLevel) else logconfig.LogLevel(str(level)))


logconfig.setup_fancy_logger = _setup_any  # type: ignore[assignment]

if __name__ == "__main__":
    from pgqueuer.__main__ import main

    main()
