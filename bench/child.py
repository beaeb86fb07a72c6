"""Entry point of every child process: ``python -m bench.child NAME '{"kwarg": ...}'``.

It imports only what the named workload needs, runs it, and prints one ``BENCH_RESULT`` line.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import logging
import os
import sys
import traceback

from bench.common import emit

# name -> "module:function"; imported lazily so a peer's import never slows our figures.
WORKLOADS = {
    "ours-migrate": "bench.ours:migrate",
    "ours-enqueue-single": "bench.ours:enqueue_single",
    "ours-enqueue-many": "bench.ours:enqueue_many",
    "ours-fill": "bench.ours:fill_only",
    "ours-drain": "bench.ours:drain",
    "ours-latency-worker": "bench.ours:latency_worker",
    "ours-latency-enqueuer": "bench.ours:latency_enqueuer",
    "ours-rss": "bench.ours:rss",
    "floor-pg-serial": "bench.floors:pg_serial",
    "floor-pg-batch": "bench.floors:pg_batch",
    "floor-pg-insert": "bench.floors:pg_insert",
    "floor-pg-insert-batch": "bench.floors:pg_insert_batch",
    "floor-redis-plain": "bench.floors:redis_plain",
    "floor-redis-pipelined": "bench.floors:redis_pipelined",
    "peer": "bench.peers:run_peer_workload",
    "timers": "bench.timers:child",
    "ie-import": "bench.import_export:child_import",
    "ie-floor": "bench.import_export:child_floor",
    "ie-export": "bench.import_export:child_export",
}


def main(argv: list[str]) -> None:
    """Run the workload named ``argv[0]`` with the JSON keyword arguments in ``argv[1]``.

    The process ends with ``os._exit`` right after the result (or the traceback) is printed: a
    library task that ignores cancellation must not hang the run at interpreter shutdown (seen
    once after the server went away mid-workload). Every workload closes what it opened itself.
    """
    name = argv[0]
    kwargs = json.loads(argv[1]) if len(argv) > 1 else {}
    module_name, _, func_name = WORKLOADS[name].partition(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
        if inspect.iscoroutinefunction(func):
            result = asyncio.new_event_loop().run_until_complete(func(**kwargs))
        else:
            result = func(**kwargs)
        emit(result)
    except BaseException:
        traceback.print_exc()
        code = 1
    else:
        code = 0
    logging.shutdown()  # a log handler's batched lines (jobs_core.logs), before _exit
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
