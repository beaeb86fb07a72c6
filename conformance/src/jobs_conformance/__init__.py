"""The conformance suite for ``jobs`` drivers, shipped as a pytest plugin.

A driver package opts in by naming :mod:`jobs_conformance.plugin` in ``pytest_plugins`` and
providing a ``driver_factory`` fixture (the contract is in that module's docstring and the
README). The suite's modules live in :mod:`jobs_conformance.suite`; the crash-proof reference jobs
in :mod:`jobs_conformance.reference`.

Nothing is imported here: the plugin must register the suite's modules for assertion rewriting
before any of them is imported.
"""

__all__: list[str] = []
