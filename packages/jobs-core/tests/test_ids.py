"""Time-ordered ids (UUIDv7, RFC 9562) as ``jobs_core.ids.new_id`` mints them."""

from __future__ import annotations

import itertools
import os
import time
import uuid

from jobs_core.ids import new_id


def test_ids_are_version_7_and_strictly_increasing_within_a_process() -> None:
    before_ms = time.time_ns() // 1_000_000
    ids = [new_id() for _ in range(20_000)]
    after_ms = time.time_ns() // 1_000_000
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert all(a < b for a, b in itertools.pairwise(ids))
    # The first 48 bits are Unix milliseconds; a burst past 4,096 ids in one millisecond borrows
    # the next, so the last may run a little ahead of the clock.
    assert before_ms <= ids[0].int >> 80 <= after_ms
    assert ids[-1].int >> 80 <= after_ms + len(ids) // 4096 + 1
    # Made without UUID.__init__, they behave as parsed ones: equal, same hash, same text.
    again = uuid.UUID(str(ids[0]))
    assert (again, hash(again), again.is_safe) == (ids[0], hash(ids[0]), ids[0].is_safe)


def test_a_forked_child_mints_other_random_bits_than_its_parent() -> None:
    new_id()  # the parent has a block of random bytes in hand
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.write(write, new_id().bytes)
        os._exit(0)
    os.close(write)
    child = uuid.UUID(bytes=os.read(read, 16))
    os.close(read)
    os.waitpid(pid, 0)
    parent = new_id()
    # The 62 random bits (and the counter's random seed) differ: the child drew its own block.
    mask = (1 << 62) - 1
    assert child.int & mask != parent.int & mask
