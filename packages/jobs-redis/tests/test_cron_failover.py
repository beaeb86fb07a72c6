"""Cron on Redis alone: two ``jobsctl scheduler`` processes, the leader SIGKILLed mid-way.

A ``* * * * *`` task in ``Europe/Paris`` runs under two schedulers on one prefix for three
minute boundaries; the leader is SIGKILLed 5 s before the second boundary, so the standby must
take the lease over (``--leader-ttl 6s``) and fire that minute itself. Every fire enqueues a row
with a fresh idempotency key, so a minute fired twice would leave two rows (no dedupe hides it).
About 3 to 4 minutes, so ``slow``::

    pytest packages/jobs-redis/tests/test_cron_failover.py -m slow -s
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from jobs_core.types import JobFilter
from jobs_redis import RedisDriver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

APP = """
    import uuid
    from datetime import datetime

    from pydantic import BaseModel

    from jobs_core import job, task


    class Fire(BaseModel):
        at: datetime
        nonce: str


    @job(input=Fire, idempotency_key=lambda f: f.nonce, tenant="none", name="cron.paris")
    async def fired(f, step, ctx):
        pass


    paris = task(
        cron="* * * * *",
        tz="Europe/Paris",
        enqueue=lambda at: [(fired, {"at": at, "nonce": uuid.uuid4().hex})],
        name="paris.minutely",
    )
"""


class Scheduler:
    """One ``jobsctl scheduler`` subprocess; its stderr is read by a thread."""

    def __init__(self, url: str, cwd: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "COLUMNS")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jobs_core.cli", "scheduler", "cronapp", "--driver", url,
             "--leader-ttl", "6s", "--tick", "500ms", "--log-level", "info"],
            cwd=cwd,
            env={**env, "NO_COLOR": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    @property
    def leads(self) -> bool:
        return "jobs.scheduler.leader-acquired" in "".join(self.lines)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._reader.join(5)


def _sleep_until(when: datetime) -> None:
    while (left := (when - datetime.now(UTC)).total_seconds()) > 0:
        time.sleep(min(left, 1.0))


async def test_two_schedulers_fire_each_paris_minute_once_across_a_leader_kill(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    (tmp_path / "cronapp.py").write_text(textwrap.dedent(APP))
    url = f"{redis_url}?prefix={prefix}"
    started = datetime.now(UTC)
    first = started.replace(second=0, microsecond=0) + timedelta(minutes=1)
    if (first - started).total_seconds() < 15:
        first += timedelta(minutes=1)  # both schedulers are up well before the first boundary
    minutes = [first + timedelta(minutes=i) for i in range(3)]
    schedulers = [Scheduler(url, tmp_path), Scheduler(url, tmp_path)]
    killed = None
    try:
        _sleep_until(minutes[1] - timedelta(seconds=5))
        leaders = [s for s in schedulers if s.leads]
        assert len(leaders) == 1, [s.lines for s in schedulers]
        killed = leaders[0]
        killed.proc.kill()
        killed.proc.wait(10)
        _sleep_until(minutes[2] + timedelta(seconds=15))
        standby = next(s for s in schedulers if s is not killed)
        assert standby.leads, "".join(standby.lines)
        assert standby.proc.poll() is None, "".join(standby.lines)
    finally:
        for s in schedulers:
            s.stop()
    driver = RedisDriver(redis_url, prefix=prefix)
    page = await driver.introspect.list(JobFilter(name="cron.paris", limit=200))
    await driver.close()
    stopped = datetime.now(UTC)
    fired = Counter(
        datetime.fromisoformat(str(row.input["at"])).astimezone(UTC)  # type: ignore[index,call-overload]
        for row in page.rows
    )
    kill_at = minutes[1] - timedelta(seconds=5)
    print(
        f"\nfires per minute (UTC), leader SIGKILLed at {kill_at:%H:%M:%S}:"
        + "".join(f"\n  {at:%H:%M} x{n}" for at, n in sorted(fired.items()))
    )
    assert all(n == 1 for n in fired.values()), f"a minute fired twice: {fired}"
    # Every minute boundary the run spanned fired (the three above among them), none other.
    spanned = []
    boundary = started.replace(second=0, microsecond=0) + timedelta(minutes=1)
    while boundary <= stopped:
        spanned.append(boundary)
        boundary += timedelta(minutes=1)
    assert set(minutes) <= set(spanned)
    assert sorted(fired) == spanned, sorted(fired)
