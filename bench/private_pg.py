"""A PostgreSQL server of the bench's own, at the server's default settings (``--private-server``).

The machine's shared server runs with ``autovacuum = off`` (the test suites' choice), so a figure
that needs a production-like server (the soak: autovacuum on, "the server's default settings plus
whatever the migrations set") starts its own: ``initdb`` into a temp directory, ``pg_ctl start``
on a free loopback port with nothing changed but where it listens (and any ``-c NAME=VALUE`` the
caller passes, e.g. ``shared_buffers=4GB``), removed when the figure ends. The server binaries run
as the ``postgres`` OS user when the bench runs as root (``initdb`` refuses root).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import bench.common


def _binary(tool: str) -> str:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{tool}"))
    located = str(found[-1]) if found else shutil.which(tool)
    if located is None:
        raise SystemExit(
            f"--private-server needs PostgreSQL's server binaries ({tool}); install them"
        )
    return located


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def private_server(settings: Sequence[str] = ()) -> Iterator[int]:
    """Run a fresh PostgreSQL server for the ``with`` block; yield its loopback port.

    While it runs, :func:`bench.common.pg_url` (and so ``fresh_database``/``drop_database``)
    points at it. ``settings`` are ``NAME=VALUE`` server settings added to the defaults.

    Raises:
        SystemExit: the server binaries are not installed.
        subprocess.CalledProcessError: ``initdb`` or ``pg_ctl`` failed (its output is attached).
    """
    home = Path(tempfile.mkdtemp(prefix="bench-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(home, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = home / "data", _free_port()
    ctl = [*as_user, _binary("pg_ctl"), "-D", str(data)]
    options = " ".join(
        [f"-p {port} -k {home} -c listen_addresses=127.0.0.1"] + [f"-c {s}" for s in settings]
    )
    before = bench.common.PG_PORT, bench.common.PG_HOST
    try:
        subprocess.run(
            [
                *as_user,
                _binary("initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
            ],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [*ctl, "-o", options, "-w", "-t", "60", "-l", str(home / "log"), "start"],
            check=True,
            capture_output=True,
        )
        bench.common.PG_PORT, bench.common.PG_HOST = port, "127.0.0.1"
        yield port
    finally:
        bench.common.PG_PORT, bench.common.PG_HOST = before
        with contextlib.suppress(subprocess.SubprocessError):
            subprocess.run([*ctl, "-m", "immediate", "-w", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(home, ignore_errors=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--private-server`` and ``--pg-setting NAME=VALUE`` (repeatable) to ``parser``."""
    parser.add_argument(
        "--private-server",
        action="store_true",
        help="run on a fresh PostgreSQL server at its default settings (autovacuum on)",
    )
    parser.add_argument(
        "--pg-setting", action="append", default=[], help="NAME=VALUE for the private server"
    )


def server_for(args: argparse.Namespace) -> contextlib.AbstractContextManager[int | None]:
    """Answer :func:`private_server` when ``args`` ask for one, else a no-op (the bench server)."""
    if args.private_server:
        return private_server(args.pg_setting)
    return contextlib.nullcontext()
