"""Fleet-wide rate buckets on PostgreSQL (the ``rate`` capability).

:meth:`PgRateStore.take_token` runs the ``rate_take`` block: one ``INSERT ... ON CONFLICT DO
UPDATE`` on ``rate_buckets`` (migration 0012) that decides and records in the same statement,
under the bucket row's lock, so two workers never both take the last token.

The clock is the database's: a request without ``now_ms`` is measured with
``clock_timestamp()`` once the statement holds the bucket's row lock (an injected test clock
where the driver has one), the server clock the hand-back's ``run_at`` and the claim's "is it
due" are read on too (``now()``, a little earlier, so a handed-back row is never due early).
Worker hosts' clocks never enter, so a skewed host can neither overrun the window nor come back
early. Rejected: the statement's own ``now()`` (its start): under a burst, takers queue on the
row's lock, and the last in the queue was stamped up to the whole queue's time before its grant,
so the next window freed its token that much early. The same holds for the commit: a take that
waited for its WAL flush reached its worker up to 180 ms after its stamp on a busy server, so
the take's transaction commits with ``synchronous_commit`` off. Before both, 3 workers under
``Rate(20, per="1s")`` showed 21 to 29 starts in some rolling second in most runs; after, 6
runs in 10 show 20 (the others 21 to 25: a take whose reply still came 120 to 180 ms after its
stamp, at the first second's boundary; not yet explained).
"""

from __future__ import annotations

from jobs_core.driver import RateRequest, check_rate_request
from jobs_pg._db import Db
from jobs_pg._records import text_value


class PgRateStore:
    """The PostgreSQL :class:`~jobs_core.driver.RateStore`: a sliding-window log per key.

    Args:
        db: the driver's connection plumbing.
    """

    def __init__(self, db: Db) -> None:
        self._db = db

    async def take_token(self, req: RateRequest) -> int:
        """Take one token of ``req.key`` (see :meth:`jobs_core.driver.RateStore.take_token`).

        Returns:
            0 when granted, else the milliseconds until the next token is free.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a bad request.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``; nothing was recorded.
        """
        check_rate_request(req)
        params = {
            "key": text_value(req.key, "key"),
            "limit": req.limit,
            "per_ms": req.per_ms,
            "now_ms": req.now_ms,
        }
        return int(await self._db.value("rate_take", params))
