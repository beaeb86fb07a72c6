"""The suite's test modules, one per area, collected by :mod:`jobs_conformance.plugin`."""
