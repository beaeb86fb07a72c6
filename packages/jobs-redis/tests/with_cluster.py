"""Run a command against a private 3-master Redis Cluster on loopback ports, then stop it.

``python packages/jobs-redis/tests/with_cluster.py -- pytest …`` starts three ``redis-server
--cluster-enabled yes`` processes in a temporary directory (no persistence, no replicas), joins
them with ``redis-cli --cluster create``, waits until every node reports ``cluster_state:ok``,
runs the command with ``JOBS_REDIS_URL=redis+cluster://127.0.0.1:<first port>`` in its
environment, then SIGTERMs the servers and removes the directory, whatever the command's
outcome. The exit status is the command's.

Ports: the first run of three free ports from 7101 up whose cluster-bus ports (port + 10000)
are free too, so a second run, or the shared server on 6379, is never touched. Standard library
only, so ``noxfile.py`` and ``bench/`` can use it without redis-py.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

MASTERS = 3
FIRST_PORT = 7101


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int = MASTERS, start: int = FIRST_PORT) -> list[int]:
    """Answer ``count`` consecutive ports from ``start`` up, each free with its bus port."""
    port = start
    while port + count < 10_000 + start:
        run = list(range(port, port + count))
        if all(_free(p) and _free(p + 10_000) for p in run):
            return run
        port += count
    raise RuntimeError("no free ports for a private cluster")


def _cli(*args: str) -> str:
    done = subprocess.run(
        ["redis-cli", *args], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"redis-cli {' '.join(args)} failed: {done.stdout}{done.stderr}")
    return done.stdout


@contextlib.contextmanager
def private_cluster(masters: int = MASTERS) -> Iterator[str]:
    """Start a private cluster of ``masters`` masters; yield its ``redis+cluster://`` URL.

    Raises:
        RuntimeError: ``redis-server``/``redis-cli`` missing, or the cluster never formed
            (within 30 s).
    """
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        raise RuntimeError("redis-server and redis-cli must be installed")
    ports = free_ports(masters)
    workdir = Path(tempfile.mkdtemp(prefix="jobs-redis-cluster-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for port in ports:
            node_dir = workdir / str(port)
            node_dir.mkdir()
            procs.append(
                subprocess.Popen(
                    [
                        "redis-server",
                        "--port",
                        str(port),
                        "--bind",
                        "127.0.0.1",
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        str(node_dir / "nodes.conf"),
                        "--cluster-node-timeout",
                        "5000",
                        "--dir",
                        str(node_dir),
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--maxmemory-policy",
                        "noeviction",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        deadline = time.monotonic() + 30
        for port in ports:
            while _free(port) or "PONG" not in _try_cli("-p", str(port), "ping"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on {port} never answered")
                time.sleep(0.05)
        _cli(
            "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
            "--cluster-replicas", "0", "--cluster-yes",
        )  # fmt: skip
        for port in ports:
            while "cluster_state:ok" not in _try_cli("-p", str(port), "cluster", "info"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the cluster never formed (node {port})")
                time.sleep(0.1)
        yield f"redis+cluster://127.0.0.1:{ports[0]}"
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def _try_cli(*args: str) -> str:
    try:
        return _cli(*args)
    except (RuntimeError, subprocess.TimeoutExpired):
        return ""


def main(argv: list[str] | None = None) -> int:
    """Start the cluster, run the command after ``--`` with ``JOBS_REDIS_URL`` set, stop it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    with private_cluster() as url:
        print(f"private cluster: {url} ({MASTERS} masters)", flush=True)
        return subprocess.run(command, env={**os.environ, "JOBS_REDIS_URL": url}).returncode


if __name__ == "__main__":
    sys.exit(main())
