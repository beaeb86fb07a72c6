"""Entry point of every child process: ``python -m bench.child NAME '{"kwarg": ...}'``.

It imports only what the named workload needs, runs it, and prints one ``BENCH_RESULT`` line.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import sys

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
    "floor-redis-plain": "bench.floors:redis_plain",
    "floor-redis-pipelined": "bench.floors:redis_pipelined",
    "peer": "bench.peers:run_peer_workload",
}


def main(argv: list[str]) -> None:
    """Run the workload named ``argv[0]`` with the JSON keyword arguments in ``argv[1]``."""
    name = argv[0]
    kwargs = json.loads(argv[1]) if len(argv) > 1 else {}
    module_name, _, func_name = WORKLOADS[name].partition(":")
    func = getattr(importlib.import_module(module_name), func_name)
    result = asyncio.run(func(**kwargs)) if inspect.iscoroutinefunction(func) else func(**kwargs)
    emit(result)


if __name__ == "__main__":
    main(sys.argv[1:])
