"""Drivers that ship with jobs-core.

Only :mod:`jobs_core.drivers.memory` lives here (``memory://``); the Postgres and Redis drivers are
distributions of their own. Every driver is reached through the ``jobs.drivers`` entry-point group
(:func:`jobs_core.driver.open_driver`), so nothing is imported from this package eagerly.
"""
