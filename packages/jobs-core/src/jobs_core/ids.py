"""Identifiers: time-ordered UUIDs (version 7, RFC 9562).

Job and run ids sort by creation time, which keeps a B-tree index append-mostly on Postgres and
gives the operator listing its newest-first order for free. Python 3.11 has no ``uuid.uuid7``, so
the layout is built here: 48 bits of Unix milliseconds, version, 12 bits of a per-millisecond
counter seeded at random, variant, 62 random bits.
"""

from __future__ import annotations

import os
import threading
import time
from uuid import UUID

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def new_id() -> UUID:
    """Answer a fresh UUIDv7; ids from one process are strictly increasing."""
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            ms = _last_ms
            _counter += 1
            if _counter > 0xFFF:
                ms += 1
                _counter = int.from_bytes(os.urandom(2), "big") & 0x7FF
        else:
            _counter = int.from_bytes(os.urandom(2), "big") & 0x7FF
        _last_ms = ms
        counter = _counter
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | rand
    return UUID(int=value)
