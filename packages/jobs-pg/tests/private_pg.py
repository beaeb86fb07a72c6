"""PostgreSQL servers a test starts for itself: restarts, read-only windows, a replica, a proxy.

The outage tests never touch the shared server: each :class:`Cluster` is ``initdb`` into a
directory of its own under the system temp dir, started with ``pg_ctl`` on a free loopback port
(trust auth, ``fsync=off``) and removed afterwards. The server binaries run as the ``postgres``
OS user when the tests run as root (``initdb`` refuses root). :class:`Proxy` is a TCP relay the
failover test switches from one server to another, counting what each upstream was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import pytest


def free_port() -> int:
    """Answer a loopback TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pg_bin(tool: str) -> str:
    """Answer the path of a PostgreSQL server binary (the newest installed version's)."""
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{tool}"))
    if not found:
        located = shutil.which(tool)
        if located is None:
            pytest.fail(f"{tool} (PostgreSQL's server binaries) is not installed")
        return located
    return str(found[-1])


class Cluster:
    """One private PostgreSQL server in a temp directory (call :meth:`remove` when done).

    Args:
        home: the directory holding ``data`` and the log (owned by the server's OS user).
        port: the loopback port it listens on.
    """

    def __init__(self, home: Path, port: int) -> None:
        self.home = home
        self.data = home / "data"
        self.port = port
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    @property
    def url(self) -> str:
        """The libpq URL of its ``postgres`` database as the ``postgres`` superuser."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @classmethod
    def create(cls) -> Cluster:
        """``initdb`` a new cluster (trust auth, replication allowed from loopback) and start it."""
        cluster = cls(_home(), free_port())
        cluster._run(
            pg_bin("initdb"), "-D", str(cluster.data), "-U", "postgres", "--auth=trust",
            "-E", "UTF8", "--no-sync",
        )  # fmt: skip
        with (cluster.data / "pg_hba.conf").open("a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\n")
        cluster.start()
        return cluster

    @classmethod
    def replica_of(cls, primary: Cluster) -> Cluster:
        """Start a streaming hot-standby replica of ``primary`` (``pg_basebackup -R``)."""
        replica = cls(_home(), free_port())
        replica._run(
            pg_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port), "-U",
            "postgres", "-D", str(replica.data), "-R", "-X", "stream", "--no-sync",
        )  # fmt: skip
        replica.start()
        return replica

    def _run(self, *argv: str) -> None:
        subprocess.run([*self.as_user, *argv], check=True, capture_output=True, timeout=120)

    def _ctl(self, *argv: str) -> None:
        self._run(pg_bin("pg_ctl"), "-D", str(self.data), *argv)

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = (
            f"-p {self.port} -k {self.home} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c max_connections=200 -c wal_level=replica -c hot_standby=on"
        )
        self._ctl("-o", options, "-w", "-t", "60", "-l", str(self.home / "log"), "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: every session is terminated)."""
        self._ctl("-m", mode, "-w", "-t", "60", "stop")

    def restart(self) -> None:
        """Stop the server (``fast``) and start it again."""
        self.stop()
        self.start()

    def promote(self) -> None:
        """Promote a standby to a primary and wait until it accepts writes."""
        self._ctl("-w", "-t", "60", "promote")

    def sql(self, statement: str) -> None:
        """Run one statement in autocommit as the superuser."""
        with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(statement)  # type: ignore[arg-type]

    def set_read_only(self, on: bool) -> None:
        """Set ``default_transaction_read_only`` cluster-wide and reload (new sessions see it).

        ``ALTER SYSTEM`` is fine here: the cluster is this test's own.
        """
        self.sql(f"ALTER SYSTEM SET default_transaction_read_only = {'on' if on else 'off'}")
        self.sql("SELECT pg_reload_conf()")

    def terminate_clients(self) -> None:
        """End every client session but the caller's (a read-only window's start)."""
        self.sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )

    def remove(self) -> None:
        """Stop the server at once (if it runs) and delete its directory."""
        with contextlib.suppress(subprocess.SubprocessError):
            self.stop("immediate")
        shutil.rmtree(self.home, ignore_errors=True)


def _home() -> Path:
    # Under the system temp dir: pytest's tmp_path is private to root, the server runs as postgres.
    home = Path(tempfile.mkdtemp(prefix="jobs-pg-private-"))
    if os.geteuid() == 0:
        shutil.chown(home, "postgres")
    return home


class Proxy:
    """A loopback TCP relay to one upstream port, switchable, noting the statements it relays.

    Attributes:
        port: where clients connect.
        upstream: the port new connections are relayed to.
        statements: upstream port -> the monotonic times the relay forwarded a statement there
            (a frontend ``Query``, ``Parse`` or ``Bind`` message), oldest first.
    """

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.port = 0
        self.statements: dict[int, list[float]] = {}
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Listen on a free loopback port."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def switch(self, upstream: int) -> None:
        """Relay NEW connections to ``upstream``; open ones stay with the old server."""
        self.upstream = upstream

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        target = self.upstream
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            writer.close()
            return
        pipes = [
            asyncio.ensure_future(self._pipe(reader, up_writer, target, _Frontend())),
            asyncio.ensure_future(self._pipe(up_reader, writer, target, None)),
        ]
        self._pipes.update(pipes)
        await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        for pipe in pipes:
            pipe.cancel()
            self._pipes.discard(pipe)
        for w in (writer, up_writer):
            w.close()

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        upstream: int,
        frontend: _Frontend | None,
    ) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if frontend is not None and (found := frontend.feed(data)):
                    self.statements.setdefault(upstream, []).extend([time.monotonic()] * found)
                writer.write(data)
                await writer.drain()

    async def close(self) -> None:
        """Stop listening and cut every relayed connection."""
        if self._server is not None:
            self._server.close()
        for pipe in list(self._pipes):
            pipe.cancel()


class _Frontend:
    """Counts the statements in one client's byte stream (PostgreSQL's frontend protocol).

    The first messages carry no type byte (an SSL or GSS encryption request, then the startup
    message); every later one is a type byte and a length.
    """

    _ENCRYPTION_REQUESTS = (80877103, 80877104)
    _STATEMENTS = (b"Q", b"P", b"B")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._started = False

    def feed(self, data: bytes) -> int:
        """Take more of the stream; answer how many statements it completed."""
        buffer = self._buffer
        buffer += data
        found = 0
        while True:
            if not self._started:
                if len(buffer) < 8:
                    return found
                length = int.from_bytes(buffer[:4], "big")
                if len(buffer) < length:
                    return found
                self._started = int.from_bytes(buffer[4:8], "big") not in self._ENCRYPTION_REQUESTS
                del buffer[:length]
                continue
            if len(buffer) < 5:
                return found
            length = int.from_bytes(buffer[1:5], "big")
            if len(buffer) < 1 + length:
                return found
            found += bytes(buffer[:1]) in self._STATEMENTS
            del buffer[: 1 + length]
