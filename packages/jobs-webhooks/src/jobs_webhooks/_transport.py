"""The HTTP client deliveries use: httpx over a connection pool that dials only pinned addresses.

The pool's network backend never resolves a name. A delivery sets the addresses the SSRF guard
checked for its ``(host, port)`` in a context variable around its request, and a new connection
dials those, and nothing else; with no pinned address for a host it refuses to connect. The URL
keeps the host name, so the ``Host`` header, TLS SNI and the certificate check all use the real
name while the socket goes to the checked address. A kept-alive connection is reused only for its
host name, within one client; endpoints that allow private addresses get a client of their own,
so a connection one of them opened is never lent to an endpoint the guard protects.

Rejected: rewriting the URL to the IP literal with an ``sni_hostname`` extension. The pool would
then key connections by address alone and could send one host's signed request over a TLS
session verified for another host at the same address.
"""

from __future__ import annotations

import asyncio
import ssl
import weakref
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import httpcore
import httpx

_PINNED: ContextVar[tuple[str, int, tuple[str, ...]] | None] = ContextVar(
    "jobs_webhooks_pinned", default=None
)

_HTTPCORE_ERRORS = (
    httpcore.TimeoutException,
    httpcore.NetworkError,
    httpcore.ProtocolError,
    httpcore.UnsupportedProtocol,
    httpcore.ProxyError,
)


@contextmanager
def pinned(host: str, port: int, addresses: Sequence[str]) -> Iterator[None]:
    """Let connections to ``host:port`` made in this context dial only ``addresses``."""
    token = _PINNED.set((host, port, tuple(addresses)))
    try:
        yield
    finally:
        _PINNED.reset(token)


class PinnedBackend(httpcore.AsyncNetworkBackend):
    """An httpcore network backend that dials the pinned addresses of the current context."""

    def __init__(self) -> None:
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        """Dial the first pinned address of ``host:port`` that answers.

        Raises:
            httpcore.ConnectError: no address is pinned for ``host:port`` here (the pool never
                resolves on its own), or none of them accepted the connection.
        """
        pin = _PINNED.get()
        if pin is None or (pin[0], pin[1]) != (host, port):
            raise httpcore.ConnectError(f"no checked address is pinned for {host}:{port}")
        failure: Exception | None = None
        for address in pin[2]:
            try:
                return await self._inner.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None  # a pin always holds at least one address
        raise failure

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.AsyncNetworkStream:
        """Refuse: a webhook never dials a Unix socket.

        Raises:
            httpcore.ConnectError: always.
        """
        raise httpcore.ConnectError("webhooks never dial a unix socket")

    async def sleep(self, seconds: float) -> None:
        """Sleep as the inner backend does."""
        await self._inner.sleep(seconds)


@contextmanager
def _httpx_errors() -> Iterator[None]:
    """Raise httpcore's errors as httpx's class of the same name (what httpx callers catch)."""
    try:
        yield
    except _HTTPCORE_ERRORS as exc:
        mapped = getattr(httpx, type(exc).__name__, httpx.TransportError)
        raise mapped(str(exc)) from exc


class _Body(httpx.AsyncByteStream):
    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _httpx_errors():
            async for chunk in self._stream:
                yield chunk

    async def aclose(self) -> None:
        closer = getattr(self._stream, "aclose", None)
        if closer is not None:
            with _httpx_errors():
                await closer()


class PinnedTransport(httpx.AsyncBaseTransport):
    """An httpx transport over an httpcore pool whose connections dial pinned addresses only.

    Args:
        ssl_context: what verifies servers' certificates (default: httpx's, the certifi CAs);
            the certificate is checked against the URL's host name, never the dialled address.
        max_keepalive: idle connections kept per client (across hosts).
        keepalive_expiry: seconds an idle connection is kept.
    """

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None = None,
        max_keepalive: int = 64,
        keepalive_expiry: float = 5.0,
    ) -> None:
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context or httpx.create_ssl_context(),
            max_connections=None,
            max_keepalive_connections=max_keepalive,
            keepalive_expiry=keepalive_expiry,
            http1=True,
            http2=False,
            network_backend=PinnedBackend(),
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` through the pool; the body streams back unread."""
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.content,
            extensions=request.extensions,
        )
        with _httpx_errors():
            response = await self._pool.handle_async_request(core)
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_Body(response.stream),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        """Close every pooled connection."""
        await self._pool.aclose()


SHARDS = 8
"""Clients per event loop and policy, taken in turn (see :meth:`Clients.get`)."""


class Clients:
    """Pinned httpx clients per event loop and per ``allow_private`` policy.

    Connections belong to the loop that opened them, so a client is never shared across loops;
    a loop that ends takes its clients with it.

    Args:
        ssl_context: passed to every client's :class:`PinnedTransport`.
    """

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self._ssl_context = ssl_context
        self._turn = 0
        self._by_loop: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[bool, list[httpx.AsyncClient]]
        ] = weakref.WeakKeyDictionary()

    def get(self, *, allow_private: bool) -> httpx.AsyncClient:
        """Answer one of the running loop's clients for that policy (made on first use).

        Requests take the :data:`SHARDS` clients in turn: httpcore's pool scans every request
        against every connection at each change, so one pool under 64 concurrent requests
        spends most of a delivery's CPU there; eight pools of a few each do not.
        Redirects are never followed and the environment's proxy settings are ignored: a proxy
        would dial the host itself, past the pinned address.
        """
        per_loop = self._by_loop.setdefault(asyncio.get_running_loop(), {})
        shards = per_loop.get(allow_private)
        if shards is None:
            if self._ssl_context is None:
                # Loading the CA bundle takes tens of ms: once, for every shard.
                self._ssl_context = httpx.create_ssl_context()
            shards = per_loop[allow_private] = [
                httpx.AsyncClient(
                    transport=PinnedTransport(ssl_context=self._ssl_context),
                    follow_redirects=False,
                    trust_env=False,
                )
                for _ in range(SHARDS)
            ]
        self._turn = (self._turn + 1) % SHARDS
        return shards[self._turn]

    async def aclose(self) -> None:
        """Close the running loop's clients."""
        per_loop = self._by_loop.pop(asyncio.get_running_loop(), {})
        for shards in per_loop.values():
            for client in shards:
                await client.aclose()
