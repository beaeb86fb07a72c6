"""The pytest plugin a driver loads to run the conformance suite.

Opt in from the driver's ``conftest.py``::

    import pytest

    pytest_plugins = ["jobs_conformance.plugin"]


    @pytest.fixture
    async def driver_factory(): ...

Fixture contract (provided by the driver, not by this plugin):

``driver_factory``
    Answers a fresh, empty :class:`jobs_core.driver.JobDriver` for each test; the driver owns
    its backend state, so tests never see each other's rows.

This module registers the ``conformance`` marker. The suite's test modules land with issue 4.
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``conformance`` marker.

    Args:
        config: the pytest configuration of the session loading this plugin.
    """
    config.addinivalue_line(
        "markers", "conformance: a test of the shared driver suite (jobs-conformance)"
    )
