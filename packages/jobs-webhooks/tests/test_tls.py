"""HTTPS to a pinned address: the certificate is checked against the URL's name, not the address.

A CA and a certificate for ``hooks.example.test`` are made with the ``openssl`` command; uvicorn
serves TLS on 127.0.0.1; the resolver seam answers that address for the name.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from jobs_core import JobRegistry, JobState
from jobs_core.drivers.memory import MemoryDriver
from jobs_webhooks import AddressGuard
from webhook_servers import Reply, Scripted, Served
from webhook_world import World, deliver, ran_out


def _openssl(*args: str, cwd: Path) -> None:
    binary = shutil.which("openssl")
    assert binary is not None, "the openssl command is not installed"
    subprocess.run([binary, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=Test CA",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=where)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=hooks.example.test",
             "-keyout", "leaf.key", "-out", "leaf.csr", cwd=where)  # fmt: skip
    (where / "san.ext").write_text("subjectAltName=DNS:hooks.example.test\n")
    _openssl("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "leaf.pem",
             cwd=where)  # fmt: skip
    return where


class TlsServed(Served):
    def __init__(self, app: Scripted, certs: Path) -> None:
        super().__init__(app)
        self.certs = certs

    def _config_options(self) -> dict[str, object]:
        return {
            "ssl_certfile": str(self.certs / "leaf.pem"),
            "ssl_keyfile": str(self.certs / "leaf.key"),
        }


async def _loopback(host: str, port: int) -> Sequence[str]:
    return ["127.0.0.1"]


@pytest.mark.parametrize(
    ("host", "delivered"), [("hooks.example.test", True), ("other.test", False)]
)
async def test_https_verifies_the_name_while_dialling_the_checked_address(
    host: str,
    delivered: bool,
    certs: Path,
    world: World,
    driver: MemoryDriver,
    registry: JobRegistry,
    name: str,
) -> None:
    app = Scripted(Reply(200))
    trusted = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    async with TlsServed(app, certs) as server:
        ep = world.add(f"https://{host}:{server.port}/in", allow_private=True)
        hook = world.declare(
            name, registry, guard=AddressGuard(resolve=_loopback), ssl_context=trusted
        )
        row = await deliver(hook, driver, registry, ep)
    (attempt,) = await world.ledger.attempts()
    if delivered:
        assert row.state == JobState.DONE and attempt.outcome == "delivered"
        assert app.seen[0].headers["host"] == f"hooks.example.test:{server.port}"
    else:
        # The same address, another name: the certificate does not cover it, nothing is sent.
        assert ran_out(row, "X_WEBHOOK_DELIVERY_FAILED") and app.seen == []
        assert "CERTIFICATE_VERIFY_FAILED" in attempt.excerpt
