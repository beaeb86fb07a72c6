"""Identifiers: time-ordered UUIDs (version 7, RFC 9562).

Job and run ids sort by creation time, which keeps a B-tree index append-mostly on Postgres and
gives the operator listing its newest-first order for free. Python 3.11 has no ``uuid.uuid7``, so
the layout is built here: 48 bits of Unix milliseconds, version, 12 bits of a per-millisecond
counter seeded at random, variant, 62 random bits.

Every enqueue mints two (the job id and the run id), so minting is on the enqueue path: the random
bits come from ``os.urandom`` in blocks (one system call per :data:`_BLOCK_IDS` ids, not two per
id), and the UUID is made without ``UUID.__init__``'s argument parsing. A forked child drops the
block it inherited, so parent and child never hand out the same random bits.
"""

from __future__ import annotations

import os
import threading
import time
from uuid import UUID, SafeUUID

_lock = threading.Lock()
_last_ms = 0
_counter = 0

_BLOCK_IDS = 256
"""Ids whose random bits one ``os.urandom`` call supplies."""

_ID_BYTES = 10
"""Random bytes an id consumes: 8 for its random tail, 2 for a new millisecond's counter seed."""

_block = b""
_at = 0

_TAIL_MASK = (1 << 62) - 1
_MS_MASK = (1 << 48) - 1
_VERSION_AND_VARIANT = 0x7 << 76 | 0b10 << 62
_new_uuid = object.__new__
_set = object.__setattr__


def _forget_block() -> None:
    """Drop the random block (in a forked child: the parent goes on using the same bytes)."""
    global _block, _at
    _block, _at = b"", 0


os.register_at_fork(after_in_child=_forget_block)


def new_id() -> UUID:
    """Answer a fresh UUIDv7; ids from one process are strictly increasing."""
    global _last_ms, _counter, _block, _at
    with _lock:
        if _at >= len(_block):
            _block, _at = os.urandom(_ID_BYTES * _BLOCK_IDS), 0
        rand = int.from_bytes(_block[_at : _at + _ID_BYTES], "big")
        _at += _ID_BYTES
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            ms = _last_ms
            _counter += 1
            if _counter > 0xFFF:
                ms += 1
                _counter = (rand >> 64) & 0x7FF
        else:
            _counter = (rand >> 64) & 0x7FF
        _last_ms = ms
        counter = _counter
    value = (ms & _MS_MASK) << 80 | _VERSION_AND_VARIANT | counter << 64 | (rand & _TAIL_MASK)
    # What UUID(int=value) makes, without its checks of arguments this function built itself.
    made: UUID = _new_uuid(UUID)
    _set(made, "int", value)
    _set(made, "is_safe", SafeUUID.unknown)
    return made
