"""A relay process that SIGKILLs itself between publishing a batch and marking it published.

``python pg_relay.py URL SCHEMA``: one pass of :class:`jobs_core.outbox.Relay` whose store dies
at ``mark_published`` (the crash window the outbox must survive: rows published, not marked).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from uuid import UUID

from jobs_core.outbox import Relay
from jobs_pg import PgOutboxStore, PostgresDriver


class DiesAtMark(PgOutboxStore):
    async def mark_published(self, ids: Sequence[UUID], token: str) -> int:
        print(f"published {len(ids)}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")


async def main(url: str, schema: str) -> None:
    driver = await PostgresDriver.connect(url, schema=schema)
    store = DiesAtMark(driver._db, driver.outbox.relay_lease)
    await Relay(store, driver, batch=50, claim_lease="1s").run_once()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
