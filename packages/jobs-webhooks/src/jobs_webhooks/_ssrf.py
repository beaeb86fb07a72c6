"""The SSRF guard: an endpoint's host is resolved once, checked, and that answer is what we dial.

A webhook URL is typed by a customer, so without a guard ``http://169.254.169.254/`` (a cloud's
metadata service) or ``http://10.0.0.5/admin`` turns the delivery worker into a proxy into our own
network. Every address the name resolves to must be public (not loopback, link-local, private,
shared, multicast, reserved or unspecified, including IPv4 addresses carried inside IPv6 forms);
one refused address refuses the endpoint. The transport then connects only to the addresses this
check answered (:mod:`jobs_webhooks._transport`), so a DNS answer that changes between the check
and the connect (DNS rebinding) cannot reach a private address.

Rejected: checking the name and letting the HTTP client resolve it again. The second answer is
the one that counts, and an attacker's DNS server can make it differ from the first.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from jobs_core.errors import WebhookEndpointInvalidError

Resolver = Callable[[str, int], Awaitable[Sequence[str]]]
"""``(host, port) -> addresses``: how a host name becomes the addresses to dial."""

_NAT64 = ipaddress.ip_network("64:ff9b::/96")


async def system_resolve(host: str, port: int) -> list[str]:
    """Resolve ``host`` with the system resolver (``getaddrinfo``); answer its addresses in order.

    Raises:
        OSError: the name does not resolve (``socket.gaierror``); a delivery counts it as a failed
            attempt, since DNS failures are often transient.
    """
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: dict[str, None] = {}
    for info in infos:
        seen.setdefault(str(info[4][0]), None)
    return list(seen)


def _kind(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if ip.is_private:
        return "private"
    if ip.is_reserved:
        return "reserved"
    if not ip.is_global:
        return "non-global"
    return None


def blocked_reason(address: str) -> str | None:
    """Answer why ``address`` may not be dialled without ``allow_private``, or ``None``.

    Args:
        address: an IPv4 or IPv6 address in text (an IPv6 scope ``%eth0`` is allowed).

    Returns:
        ``"loopback"``, ``"link-local"``, ``"private"``, ``"multicast"``, ``"unspecified"``,
        ``"reserved"`` or ``"non-global"`` (shared, documentation and other special ranges), for
        the address itself or an IPv4 address it carries (IPv4-mapped, NAT64, 6to4); ``None``
        for a public address. Text that is no address answers ``"invalid"``.
    """
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return "invalid"
    if isinstance(ip, ipaddress.IPv6Address):
        # A form that carries an IPv4 address reaches that address: its verdict is the IPv4's.
        carried: ipaddress.IPv4Address | None = ip.ipv4_mapped or ip.sixtofour
        if carried is None and ip in _NAT64:
            carried = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if carried is not None:
            return _kind(carried)
    return _kind(ip)


@dataclass(frozen=True, slots=True)
class AddressGuard:
    """Resolve an endpoint's host and refuse the addresses it may not reach.

    Args:
        resolve: ``(host, port) -> addresses`` (default :func:`system_resolve`). Tests and apps
            with their own DNS pass theirs.
        blocked: ``(address) -> reason or None`` (default :func:`blocked_reason`). An app whose
            trusted endpoints live in one internal range can allow just that range here rather
            than setting ``allow_private`` on each endpoint.
    """

    resolve: Resolver = system_resolve
    blocked: Callable[[str], str | None] = blocked_reason

    async def check(self, host: str, port: int, *, allow_private: bool) -> list[str]:
        """Answer the addresses a request to ``host:port`` may dial: the pinned answer.

        Args:
            host: the URL's host (an IDNA-encoded name or an IP literal, without brackets).
            port: the URL's port.
            allow_private: skip the refusal (for trusted internal endpoints and tests).

        Raises:
            WebhookEndpointInvalidError: ``X_WEBHOOK_ENDPOINT_INVALID`` when an address is refused
                (``meta["reason"]`` says which kind), or the name resolves to nothing.
            OSError: the resolver failed (a transient failure: the attempt is retried).
        """
        try:
            addresses = [str(ipaddress.ip_address(host))]
        except ValueError:
            addresses = [str(a) for a in await self.resolve(host, port)]
        if not addresses:
            raise WebhookEndpointInvalidError(
                f"the endpoint's host {host!r} resolves to no address", reason="unresolved"
            )
        if not allow_private:
            for address in addresses:
                reason = self.blocked(address)
                if reason is not None:
                    raise WebhookEndpointInvalidError(
                        f"the endpoint's host {host!r} resolves to a {reason} address; "
                        "webhooks go to public addresses unless the endpoint sets "
                        "allow_private=True",
                        reason=reason,
                    )
        return addresses
