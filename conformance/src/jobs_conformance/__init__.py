"""The conformance suite for ``jobs`` drivers, shipped as a pytest plugin.

A driver package opts in by naming :mod:`jobs_conformance.plugin` in ``pytest_plugins`` and
providing a ``driver_factory`` fixture (the contract is in that module's docstring). The test
modules themselves land with issue 4; today the distribution carries the plugin and its contract.
"""

__all__: list[str] = []
