"""The SSRF guard: refused addresses never see a socket; the checked answer is the one dialled.

Only loopback addresses of this machine are ever dialled: the refusals of 10.0.0.1 and
169.254.169.254 happen before any connection, and the DNS-change test moves between two loopback
addresses (127.0.0.2 plays the public one).
"""

from __future__ import annotations

from collections.abc import Sequence

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import new_secret
from jobs_core import JobRegistry, JobState
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import WebhookEndpointInvalidError
from jobs_webhooks import AddressGuard, Endpoint, blocked_reason
from jobs_webhooks._transport import Clients, pinned
from webhook_servers import Reply, Scripted, Served
from webhook_world import World, deliver


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("10.0.0.1", "private"),
        ("172.16.5.4", "private"),
        ("192.168.1.1", "private"),
        ("fd00::1", "private"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("100.64.0.1", "non-global"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:10.0.0.1", "private"),
        ("64:ff9b::a9fe:a9fe", "link-local"),
        ("2002:7f00:1::", "loopback"),
        ("8.8.8.8", None),
        ("2606:4700:4700::1111", None),
        ("not-an-address", "invalid"),
    ],
)
def test_blocked_reason(address: str, reason: str | None) -> None:
    assert blocked_reason(address) == reason


@given(st.ip_addresses(v=4))
def test_an_ipv4_address_and_its_mapped_form_get_one_verdict(address: object) -> None:
    mapped = f"::ffff:{address}"
    assert (blocked_reason(str(address)) is None) == (blocked_reason(mapped) is None)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{v4}/hook",
        "http://[::1]:{v6}/hook",
        "http://localhost:{v4}/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/admin",
    ],
)
async def test_private_destinations_are_refused_before_any_socket(
    url: str, world: World, driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    app = Scripted(Reply(200))
    async with Served(app, "127.0.0.1") as v4, Served(app, "::1") as v6:
        ep = world.add(url.format(v4=v4.port, v6=v6.port), allow_private=False)
        hook = world.declare(name, registry)
        row = await deliver(hook, driver, registry, ep)
        assert v4.connections == 0 and v6.connections == 0
    assert row.state == JobState.DEAD and row.last_error_code == "X_WEBHOOK_ENDPOINT_INVALID"
    (attempt,) = await world.ledger.attempts()
    assert attempt.outcome == "refused" and attempt.status is None
    assert attempt.code == "X_WEBHOOK_ENDPOINT_INVALID"


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
async def test_allow_private_reaches_a_local_receiver(
    host: str, world: World, driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    app = Scripted(Reply(200))
    async with Served(app, "::1" if host == "::1" else "127.0.0.1") as server:
        shown = f"[{host}]" if ":" in host else host
        ep = world.add(f"http://{shown}:{server.port}/hook", allow_private=True)
        hook = world.declare(name, registry)
        row = await deliver(hook, driver, registry, ep)
    assert row.state == JobState.DONE and len(app.seen) == 1


class Flipping:
    """A resolver whose answer changes after the first lookup (a rebinding DNS server)."""

    def __init__(self, first: str, then: str) -> None:
        self.answers = [first, then]
        self.calls = 0

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.calls += 1
        return [self.answers[min(self.calls - 1, 1)]]


async def test_the_checked_address_is_the_one_dialled_whatever_dns_answers_next(
    world: World, driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    public, internal = Scripted(Reply(200)), Scripted(Reply(200))
    # 127.0.0.2 plays a public address (the guard allows it); 127.0.0.1 is the internal service
    # that the system resolver answers for "localhost" - what a second lookup would reach.
    outside = Served(public, "127.0.0.2")
    async with outside, Served(internal, "127.0.0.1", port=outside.port) as inside:
        resolver = Flipping("127.0.0.2", "127.0.0.1")
        guard = AddressGuard(
            resolve=resolver,
            blocked=lambda a: None if a == "127.0.0.2" else blocked_reason(a),
        )
        ep = world.add(f"http://localhost:{outside.port}/hook", allow_private=False)
        hook = world.declare(name, registry, guard=guard)
        row = await deliver(hook, driver, registry, ep)
        assert inside.connections == 0 and internal.seen == []
    assert row.state == JobState.DONE
    assert resolver.calls == 1
    (seen,) = public.seen
    assert seen.headers["host"] == f"localhost:{outside.port}"


async def test_a_name_the_resolver_answers_with_loopback_is_refused(
    world: World, driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    internal = Scripted(Reply(200))
    async with Served(internal, "127.0.0.1") as inside:
        resolver = Flipping("127.0.0.1", "127.0.0.1")
        guard = AddressGuard(resolve=resolver)
        ep = world.add(f"http://hooks.example.test:{inside.port}/", allow_private=False)
        hook = world.declare(name, registry, guard=guard)
        row = await deliver(hook, driver, registry, ep)
        assert inside.connections == 0
    assert row.last_error_code == "X_WEBHOOK_ENDPOINT_INVALID"
    assert "loopback" in (row.last_error or "")


async def test_one_refused_address_among_several_refuses_the_endpoint() -> None:
    async def both(host: str, port: int) -> list[str]:
        return ["93.184.216.34", "10.1.2.3"]

    with pytest.raises(WebhookEndpointInvalidError) as caught:
        await AddressGuard(resolve=both).check("hooks.example.test", 443, allow_private=False)
    assert caught.value.meta["reason"] == "private"


async def test_the_pool_never_dials_a_host_it_was_not_given_an_address_for() -> None:
    app = Scripted(Reply(200))
    clients = Clients()
    async with Served(app) as server:
        client = clients.get(allow_private=True)
        with pytest.raises(httpx.ConnectError, match="no checked address"):
            await client.get(f"{server.url}/")
        # Pinned to another host's address: still refused for this one.
        with (
            pinned("elsewhere.test", server.port, ["127.0.0.1"]),
            pytest.raises(httpx.ConnectError),
        ):
            await client.get(f"{server.url}/")
        assert server.connections == 0
        with pinned("127.0.0.1", server.port, ["127.0.0.1"]):
            assert (await client.get(f"{server.url}/")).status_code == 200
        await clients.aclose()


def test_an_endpoint_with_a_bad_url_or_secret_is_refused_at_once() -> None:
    for url in ("ftp://example.com/", "not a url", "http:///path", "file:///etc/passwd"):
        with pytest.raises(WebhookEndpointInvalidError):
            Endpoint(id="ep", url=url, secrets=[new_secret()])
    for secret in ("plain-text", "whsec_!!!", "whsec_c2hvcnQ="):
        with pytest.raises(WebhookEndpointInvalidError) as caught:
            Endpoint(id="ep", url="https://example.com/", secrets=[secret])
        assert secret not in str(caught.value)
    with pytest.raises(WebhookEndpointInvalidError):
        Endpoint(id="ep", url="https://example.com/", secrets=[])
    for headers in ({"x-a": "b\r\nx-injected: 1"}, {"x-a": "€"}, {"x-a": 1}):
        with pytest.raises(WebhookEndpointInvalidError):
            Endpoint(id="ep", url="https://example.com/", secrets=[new_secret()], headers=headers)
    assert "secrets" not in repr(
        Endpoint(id="ep", url="https://example.com/", secrets=new_secret())
    )
