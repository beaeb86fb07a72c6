"""Benchmarks (issue 8): our drivers against the Python peers and the backends' own floors.

Run with ``nox -s bench`` (see ``python -m bench --help``); never part of the test sessions.
"""
