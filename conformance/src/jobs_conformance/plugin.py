"""The pytest plugin a driver loads to run the conformance suite against itself.

Opt in from the ``conftest.py`` at the top of the driver's tests::

    import pytest

    from jobs_conformance.target import DriverFactory

    pytest_plugins = ["jobs_conformance.plugin"]


    @pytest.fixture
    def driver_factory() -> DriverFactory:
        async def open_driver():
            return MyDriver(...)  # over this test's fresh, empty backend

        return open_driver

Fixtures the driver provides (see ``conformance/README.md`` for the full contract):

``driver_factory`` (required)
    Answers an async callable returning a :class:`~jobs_core.driver.JobDriver` over a backend
    that is fresh and empty for each test. Every call within one test answers a driver over the
    SAME backend: a new connection each time, or the same object when the driver is in-process
    and safe to share between threads (the memory driver). If the callable takes a keyword
    ``clock``, the driver decides "due" and "lapsed" on that clock and the suite moves time with
    a :class:`~jobs_core.testing.ManualClock`; otherwise the suite waits out short real delays.
    The suite closes every distinct driver object it got; the fixture's own teardown removes
    the backend.
``crash_worker_command`` (optional)
    Answers a callable ``(app) -> argv`` starting a worker subprocess (``jobsctl worker APP
    --driver URL``) against the same backend; the crash-proof tests then SIGKILL real processes.
    Without it the kills are simulated in-process (the memory driver's case).
``outbox_transaction`` (optional, needed when the driver declares ``outbox``)
    Answers a callable returning an async context manager that yields the outbox store's
    transaction handle, commits on a clean exit and rolls back on an exception.

How the suite is collected: the suite's modules ship in :mod:`jobs_conformance.suite`. When
pytest collects the directory of a ``conftest.py`` that names this plugin in ``pytest_plugins``,
the plugin adds a ``jobs-conformance`` collector there holding every suite module, so the
driver's fixtures (defined in that conftest) apply to them and ``pytest <that directory>`` runs
the suite. Every suite test carries the ``conformance`` marker (``-m conformance`` selects only
the suite, ``-m "not conformance"`` skips it). Rejected alternative: ``pytest --pyargs
jobs_conformance.suite``, which cannot see fixtures defined in the driver's conftest (conftest
fixtures apply only below their own directory) and would force every driver to ship a plugin
module of its own.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import pytest_asyncio

pytest.register_assert_rewrite("jobs_conformance.suite", "jobs_conformance.target")

from jobs_conformance.target import Target  # noqa: E402 - after the rewrite registration

PLUGIN = "jobs_conformance.plugin"
"""This module's name, as a driver writes it in ``pytest_plugins``."""

SUITE_DIR = Path(__file__).parent / "suite"
"""Where the suite's test modules live."""

KILL_POINTS = pytest.StashKey[list[tuple[str, int]]]()
"""Per session: ``(reference job, kill points exercised)`` for the terminal summary."""


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``conformance`` marker and the kill-point tally.

    Args:
        config: the pytest configuration of the session loading this plugin.
    """
    config.addinivalue_line(
        "markers", "conformance: a test of the shared driver suite (jobs-conformance)"
    )
    config.stash[KILL_POINTS] = []


def _opts_in(module: object) -> bool:
    plugins = getattr(module, "pytest_plugins", ())
    if isinstance(plugins, str):
        plugins = [plugins]
    return isinstance(module, ModuleType) and PLUGIN in plugins


def _opted_in_conftests(config: pytest.Config) -> set[Path]:
    return {
        Path(str(plugin.__file__)).resolve()
        for plugin in config.pluginmanager.get_plugins()
        if _opts_in(plugin) and getattr(plugin, "__file__", None)
    }


class ConformanceSuite(pytest.Collector):
    """The suite's modules, collected under the directory of an opting-in conftest."""

    def collect(self) -> Iterable[pytest.Item | pytest.Collector]:
        """Answer one module collector per suite module, in name order."""
        for path in sorted(SUITE_DIR.glob("test_*.py")):
            yield pytest.Module.from_parent(
                self, path=path, name=path.name, nodeid=f"{self.nodeid}::{path.name}"
            )


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """Hang the suite under the directory whose ``conftest.py`` opted in.

    Args:
        file_path: a file pytest found while collecting ``parent``.
        parent: the directory collector.

    Returns:
        The suite collector for an opting-in ``conftest.py``, else ``None``.
    """
    if file_path.name != "conftest.py":
        return None
    if file_path.resolve() not in _opted_in_conftests(parent.config):
        return None
    suite = ConformanceSuite.from_parent(parent, name="jobs-conformance")
    suite.add_marker(pytest.mark.conformance)
    return suite


@pytest.fixture
def crash_worker_command() -> Callable[[str], list[str]] | None:
    """Answer ``None``: no worker subprocess, so crash tests simulate kills in-process.

    A driver with an out-of-process backend overrides this fixture (see the module docstring).
    """
    return None


@pytest.fixture
def outbox_transaction() -> Any:
    """Answer ``None``: a driver declaring ``outbox`` overrides it (see the module docstring)."""
    return None


@pytest_asyncio.fixture
async def target(driver_factory: Callable[..., Any]) -> AsyncIterator[Target]:
    """Answer the driver under test for one test, closing every driver opened for it.

    Args:
        driver_factory: the driver package's fixture (see the module docstring).
    """
    if not callable(driver_factory):
        raise TypeError("driver_factory must answer an async callable returning a JobDriver")
    accepts_clock = "clock" in inspect.signature(driver_factory).parameters
    opened = await Target.open(driver_factory, accepts_clock=accepts_clock)
    try:
        yield opened
    finally:
        await opened.close()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Print how many crash kill points the session exercised.

    Args:
        terminalreporter: pytest's terminal reporter.
        config: the session's configuration.
    """
    tally = config.stash.get(KILL_POINTS, [])
    if not tally:
        return
    total = sum(points for _, points in tally)
    terminalreporter.write_sep("-", "jobs-conformance crash-proof")
    terminalreporter.write_line(
        f"{total} kill points exercised across {len(tally)} reference job runs: "
        + ", ".join(f"{name}={points}" for name, points in tally)
    )
