"""The floors: what the backend does with no queue logic at all, measured in the same run.

* ``pg-serial``: psycopg in autocommit, per job one ``INSERT ... RETURNING id`` and one
  ``UPDATE ... SET state = 'done'`` (two commits, two round trips).
* ``pg-batch``: the same with 1,000 rows per statement (an ``INSERT ... SELECT FROM unnest``
  and an ``UPDATE ... WHERE id = ANY``).
* ``pg-insert``: psycopg in autocommit, one ``INSERT`` of one row per call into a table with
  only a primary key: one round trip and one durable commit, the ceiling of a single enqueue.
* ``pg-insert-batch``: the same with 1,000 rows per ``INSERT ... SELECT FROM unnest``: the
  ceiling of ``enqueue_many``.
* ``redis-plain``: redis-py, per job one ``LPUSH`` and one ``RPOP``.
* ``redis-pipelined``: the same commands sent 1,000 pairs per pipeline (no MULTI).

Each verifies its outcome by count before answering.
"""

from __future__ import annotations

import json
import time
from typing import Any

BATCH = 1_000

_TABLE = """
CREATE TABLE floor_jobs (
    id bigserial PRIMARY KEY,
    state text NOT NULL DEFAULT 'ready',
    payload jsonb NOT NULL
)
"""


def pg_serial(url: str, n: int) -> dict[str, Any]:
    """INSERT then UPDATE per job, autocommit; answer jobs/s."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_TABLE)
        payload = json.dumps({"k": "x"})
        started = time.perf_counter()
        for _ in range(n):
            row = conn.execute(
                "INSERT INTO floor_jobs (payload) VALUES (%s) RETURNING id", (payload,)
            ).fetchone()
            assert row is not None
            conn.execute("UPDATE floor_jobs SET state = 'done' WHERE id = %s", (row[0],))
        elapsed = time.perf_counter() - started
        done = _done(conn)
    _verify(done, n)
    return {"value": n / elapsed, "unit": "jobs/s", "n": n, "seconds": elapsed}


def pg_batch(url: str, n: int) -> dict[str, Any]:
    """The same with 1,000 rows per statement; answer jobs/s."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_TABLE)
        payloads = [json.dumps({"k": str(i)}) for i in range(BATCH)]
        started = time.perf_counter()
        for _ in range(n // BATCH):
            ids = [
                r[0]
                for r in conn.execute(
                    "INSERT INTO floor_jobs (payload) SELECT unnest(%s::jsonb[]) RETURNING id",
                    (payloads,),
                ).fetchall()
            ]
            conn.execute("UPDATE floor_jobs SET state = 'done' WHERE id = ANY(%s)", (ids,))
        elapsed = time.perf_counter() - started
        done = _done(conn)
    _verify(done, n // BATCH * BATCH)
    return {"value": n // BATCH * BATCH / elapsed, "unit": "jobs/s", "n": n, "seconds": elapsed}


_INSERT_TABLE = """
CREATE TABLE floor_inserts (
    id uuid PRIMARY KEY,
    payload jsonb NOT NULL
)
"""


def pg_insert(url: str, n: int) -> dict[str, Any]:
    """One single-row INSERT per call, autocommit, prepared; answer rows/s."""
    import uuid

    import psycopg

    with psycopg.connect(url, autocommit=True, prepare_threshold=0) as conn:
        conn.execute(_INSERT_TABLE, prepare=False)
        payload = json.dumps({"k": "x"})
        started = time.perf_counter()
        for _ in range(n):
            conn.execute(
                "INSERT INTO floor_inserts (id, payload) VALUES (%s, %s)", (uuid.uuid4(), payload)
            )
        elapsed = time.perf_counter() - started
        _verify(_inserted(conn), n)
    return {"value": n / elapsed, "unit": "jobs/s", "n": n, "seconds": elapsed}


def pg_insert_batch(url: str, n: int) -> dict[str, Any]:
    """1,000 rows per INSERT ... SELECT FROM unnest, autocommit; answer rows/s."""
    import uuid

    import psycopg

    with psycopg.connect(url, autocommit=True, prepare_threshold=0) as conn:
        conn.execute(_INSERT_TABLE, prepare=False)
        payloads = [json.dumps({"k": str(i)}) for i in range(BATCH)]
        started = time.perf_counter()
        for _ in range(n // BATCH):
            ids = [uuid.uuid4() for _ in range(BATCH)]
            conn.execute(
                "INSERT INTO floor_inserts (id, payload) "
                "SELECT * FROM unnest(%s::uuid[], %s::jsonb[])",
                (ids, payloads),
            )
        elapsed = time.perf_counter() - started
        _verify(_inserted(conn), n // BATCH * BATCH)
    return {"value": n // BATCH * BATCH / elapsed, "unit": "jobs/s", "n": n, "seconds": elapsed}


def redis_plain(url: str, n: int) -> dict[str, Any]:
    """LPUSH then RPOP per job; answer jobs/s."""
    import redis

    client = redis.Redis.from_url(url)
    client.delete("floor:q")
    payload = json.dumps({"k": "x"})
    popped = 0
    started = time.perf_counter()
    for _ in range(n):
        client.lpush("floor:q", payload)
        popped += client.rpop("floor:q") is not None
    elapsed = time.perf_counter() - started
    left = client.llen("floor:q")
    client.close()
    _verify(popped, n)
    _verify(left, 0)
    return {"value": n / elapsed, "unit": "jobs/s", "n": n, "seconds": elapsed}


def redis_pipelined(url: str, n: int) -> dict[str, Any]:
    """LPUSH then RPOP, 1,000 pairs per pipeline; answer jobs/s."""
    import redis

    client = redis.Redis.from_url(url)
    client.delete("floor:q")
    payload = json.dumps({"k": "x"})
    popped = 0
    started = time.perf_counter()
    for _ in range(n // BATCH):
        pipe = client.pipeline(transaction=False)
        for _ in range(BATCH):
            pipe.lpush("floor:q", payload)
            pipe.rpop("floor:q")
        popped += sum(1 for reply in pipe.execute()[1::2] if reply is not None)
    elapsed = time.perf_counter() - started
    left = client.llen("floor:q")
    client.close()
    _verify(popped, n // BATCH * BATCH)
    _verify(left, 0)
    return {"value": n // BATCH * BATCH / elapsed, "unit": "jobs/s", "n": n, "seconds": elapsed}


def _done(conn: Any) -> int:
    row = conn.execute("SELECT count(*) FROM floor_jobs WHERE state = 'done'").fetchone()
    return int(row[0])


def _inserted(conn: Any) -> int:
    row = conn.execute("SELECT count(*) FROM floor_inserts").fetchone()
    return int(row[0])


def _verify(got: int, expected: int) -> None:
    if got != expected:
        raise AssertionError(f"floor counted {got}, expected {expected}")
