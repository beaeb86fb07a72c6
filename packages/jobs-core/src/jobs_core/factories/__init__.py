"""Factories over :func:`jobs_core.job`: each answers an ordinary job handle.

Retries, queues, cancel, dead letters, introspection and metrics apply to them as to any job.
One module per factory: :mod:`~jobs_core.factories.backfill` (one pass over a table or a remote
cursor, one step per page, a ledger row per pass), :mod:`~jobs_core.factories.purge` (a retention
sweep over named targets), :mod:`~jobs_core.factories.consumer` (a long-running reader of a
queue, a change stream or a vendor cursor, with its cursor saved in the handler's transaction),
and :mod:`~jobs_core.factories.keyset` (the keyset source backfills read tables with). Each
factory is registered in the ``jobs.factories`` entry-point group, so ``jobsctl manifest`` lists
it.
"""

from jobs_core.factories.backfill import (
    DEFAULT_BACKFILL_BATCH,
    DEFAULT_BACKFILL_RATE,
    BackfillContext,
    BackfillJob,
    BackfillPlan,
    backfill,
    pending_backfills,
    registered_backfills,
)
from jobs_core.factories.consumer import (
    ConsumerCursor,
    ConsumerJob,
    ConsumerKey,
    CursorWrite,
    MemoryCursorStore,
    consumer,
)
from jobs_core.factories.keyset import BackfillSource, KeysetSource, keyset
from jobs_core.factories.purge import (
    DEFAULT_PURGE_CRON,
    Purgeable,
    PurgeJob,
    PurgeTarget,
    purge,
    retention_targets,
)

__all__ = [
    "DEFAULT_BACKFILL_BATCH",
    "DEFAULT_BACKFILL_RATE",
    "DEFAULT_PURGE_CRON",
    "BackfillContext",
    "BackfillJob",
    "BackfillPlan",
    "BackfillSource",
    "ConsumerCursor",
    "ConsumerJob",
    "ConsumerKey",
    "CursorWrite",
    "KeysetSource",
    "MemoryCursorStore",
    "PurgeJob",
    "PurgeTarget",
    "Purgeable",
    "backfill",
    "consumer",
    "keyset",
    "pending_backfills",
    "purge",
    "registered_backfills",
    "retention_targets",
]
