"""A private PostgreSQL cluster on a free loopback port, for tests that stop or restart a server.

The shared server on 5432 is never stopped: a test that needs an outage starts one of these
(``initdb`` into a temporary directory, ``pg_ctl`` to start and stop it), as the ``postgres``
user when the tests run as root (the server refuses to run as root).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(f"no {name} under /usr/lib/postgresql/*/bin: install postgresql")
    return found[-1]


def free_port() -> int:
    """Answer a loopback TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateCluster:
    """One throwaway cluster: ``start()``, ``stop()``, ``start()`` again, ``destroy()``.

    Attributes:
        port: the loopback port it listens on.
        url: a libpq URL of its ``postgres`` database (trust auth, user ``postgres``).
    """

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="jobs-private-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "-N")

    def _run(self, *argv: str) -> None:
        cmd = ["runuser", "-u", "postgres", "--", *argv] if self._as_postgres else list(argv)
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories=''"
        log = str(self.root / "server.log")
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-o", options, "-l", log, "-w", "start")

    def stop(self) -> None:
        """Stop the server (fast shutdown: every session is terminated)."""
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def destroy(self) -> None:
        """Stop the server if it runs and delete its files."""
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
