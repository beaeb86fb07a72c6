"""Per-job outcome counters on Redis (the ``counters`` capability).

Layout (``<base>`` is the prefix's ``"{<prefix>}:"``, so every key is under its hash tag):

=====================================  =========================================================
key                                    holds
=====================================  =========================================================
``<base>cn``                           the job names with at least one bucket (a set)
``<base>cz:<tier>:<name>``             a tier's bucket starts (ms since the epoch), each
                                       scored by itself
``<base>cb:<tier>:<start ms>:<name>``  one bucket: a hash of ``done``, ``retried``, ``failed``,
                                       ``dead`` and ``dur`` (summed duration, ms)
=====================================  =========================================================

The settling scripts add to the 1-minute bucket holding the server's ``TIME`` in the same call
that settles the row (``ack.lua``: ``done`` and ``dur``; ``nack.lua``: ``retried``, ``failed``
or ``dead``; ``claim.lua``: a lapsed final attempt's burial), so a counter never disagrees with
a settle. Reads and the rollup walk the name set and the per-tier sorted sets, never the
keyspace (no ``KEYS``/``SCAN``). The tiers, their widths and retentions come from
:data:`jobs_core.types.COUNTER_TIERS` and are sent with each call, so the rules are the memory
and pg drivers' to the millisecond.

Rejected alternative: one hash per job name with a field per bucket and outcome. A busy name's
hash passes the listpack limits at once and costs more per field than a small hash per bucket,
and a rollup would have to read the whole hash to find the aged buckets.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from jobs_core.types import COUNTER_TIERS, MAX_COUNTER_ROWS, CounterBucket
from jobs_redis._codec import from_us, to_us

if TYPE_CHECKING:
    from jobs_redis._driver import _Shared

ROLLUP_BATCH = 1_000
"""The most buckets one ``counter_rollup.lua`` call folds or drops; the rollup calls again until
none is left, so a catch-up after a long outage never holds the server for long."""

_WIDTHS: list[str | int] = [v for spec in COUNTER_TIERS for v in (spec.tier, spec.width_ms)]
_TIERS: list[str | int] = [
    v for spec in COUNTER_TIERS for v in (spec.tier, spec.width_ms, spec.kept_ms)
]


class RedisCounterStore:
    """The Redis driver's :class:`~jobs_core.driver.CounterStore` (layout: the module docstring).

    Tiers: 1-minute buckets kept 24 h, 5-minute 7 d, 1-hour 30 d, aligned on the Unix epoch.

    Args:
        shared: the driver's connection and keys.
    """

    def __init__(self, shared: _Shared) -> None:
        """Serve ``shared`` (the argument is described in the class docstring)."""
        self._s = shared

    async def counters(self, name: str, since: datetime) -> list[CounterBucket]:
        """Answer ``name``'s buckets that end after ``since``, oldest first (the newest 4,176).

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive ``since``.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        base = self._s.keys.base
        args = [base, name, to_us(since, "since"), MAX_COUNTER_ROWS, *_WIDTHS]
        flat = await self._s.run("counters", [base + "cn"], args)
        return [
            CounterBucket(
                name=name,
                tier=v[0],
                bucket=from_us(int(v[1]) * 1000),
                done=int(v[2]),
                retried=int(v[3]),
                failed=int(v[4]),
                dead=int(v[5]),
                duration_ms=float(v[6]),
            )
            for v in (flat[i : i + 7] for i in range(0, len(flat), 7))
        ]

    async def totals(self, since: datetime) -> dict[str, CounterBucket]:
        """Answer, per job name with a bucket ending after ``since``, the sum of those buckets.

        Each total's ``bucket`` is ``since`` and its ``tier`` the coarsest tier summed.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive ``since``.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        base = self._s.keys.base
        args = [base, to_us(since, "since"), *_WIDTHS]
        since = since.astimezone(UTC)
        flat = await self._s.run("counter_totals", [base + "cn"], args)
        return {
            v[0]: CounterBucket(
                name=v[0],
                tier=v[6],
                bucket=since,
                done=int(v[1]),
                retried=int(v[2]),
                failed=int(v[3]),
                dead=int(v[4]),
                duration_ms=float(v[5]),
            )
            for v in (flat[i : i + 7] for i in range(0, len(flat), 7))
        }

    async def rollup(self, *, now: datetime | None = None) -> int:
        """Fold aged buckets into the next tier and drop expired hour buckets.

        A bucket ages once its whole parent bucket ended more than its tier's retention ago; one
        call catches up however long it was since the last, in script calls of at most
        :data:`ROLLUP_BATCH` buckets. Two callers at once (two schedulers) fold each bucket once.

        Args:
            now: fold as if the server's clock read this instant (tests); ``None``, the default,
                folds at the server's ``TIME``.

        Returns:
            How many buckets were folded or dropped.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive ``now``.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        base = self._s.keys.base
        at = "" if now is None else to_us(now, "now") // 1000
        changed = 0
        while True:
            args = [base, ROLLUP_BATCH, at, *_TIERS]
            folded, more = await self._s.run("counter_rollup", [base + "cn"], args)
            changed += int(folded)
            if not int(more):
                return changed
