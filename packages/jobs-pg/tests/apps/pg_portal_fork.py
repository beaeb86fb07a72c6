"""Enqueue, fork, enqueue in both: the portal's fork safety, as gunicorn ``--preload`` meets it.

Run as ``python pg_portal_fork.py URL N``: the parent enqueues N rows with ``enqueue_sync`` (its
portal loop and pool now exist), forks, and parent and child each enqueue N more, concurrently.
Each process prints ``ok <pid> <count>`` when every call returned, and the parent exits with the
child's status folded in (0 only when both succeeded).
"""

from __future__ import annotations

import os
import sys

from pydantic import BaseModel

from jobs_core import install_driver, job
from jobs_core.driver import open_driver


class Mark(BaseModel):
    who: str
    n: int


@job(input=Mark, idempotency_key=lambda m: f"{m.who}:{m.n}", tenant="none", name="fork.mark")
async def mark(input: Mark, step: object, ctx: object) -> None:
    return None


def burst(who: str, count: int) -> None:
    for n in range(count):
        mark.enqueue_sync(Mark(who=who, n=n))
    print(f"ok {os.getpid()} {who} {count}", flush=True)


def main() -> int:
    url, count = sys.argv[1], int(sys.argv[2])
    install_driver(open_driver(url, max_size=4))
    burst("before", count)
    child = os.fork()
    if child == 0:
        try:
            burst("child", count)
        except BaseException as exc:
            print(f"child failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            os._exit(1)
        # A normal exit, so the child's exit hook closes its own pool (not the parent's).
        sys.stdout.flush()
        return 0
    burst("parent", count)
    _, status = os.waitpid(child, 0)
    return 0 if os.waitstatus_to_exitcode(status) == 0 else 2


if __name__ == "__main__":
    sys.exit(main())
