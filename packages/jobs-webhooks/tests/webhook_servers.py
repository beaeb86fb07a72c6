"""Real HTTP servers for the tests: uvicorn on 127.0.0.1 (or another loopback address).

:class:`Served` runs any ASGI app under uvicorn in the test's own event loop, on a socket it
binds itself (a free port, no race), and counts the TCP connections uvicorn accepted.
:class:`Scripted` is an endpoint that answers from a script and records every request it read.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

ASGIApp = Callable[..., Awaitable[None]]


class Served:
    """An ASGI app under uvicorn, on ``host`` and a free (or given) port.

    ``connections`` counts the connections uvicorn accepted; ``url`` is its base URL.
    """

    def __init__(self, app: ASGIApp, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.connections = 0
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "https" if self._config_options() else "http"
        return f"{scheme}://{host}:{self.port}"

    def _config_options(self) -> dict[str, object]:
        """More ``uvicorn.Config`` options (a subclass serving TLS adds its certificate)."""
        return {}

    def _protocol(self) -> type[H11Protocol]:
        served = self

        class Counting(H11Protocol):
            def connection_made(self, transport: Any) -> None:  # type: ignore[override]
                served.connections += 1
                super().connection_made(transport)

        return Counting

    async def __aenter__(self) -> Served:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            http=self._protocol(),
            timeout_graceful_shutdown=2,
            # The tests set Date themselves (a Retry-After date is read against it).
            date_header=False,
            server_header=False,
            **self._config_options(),  # type: ignore[arg-type]
        )
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        deadline = time.monotonic() + 10
        while not self._server.started:
            if self._task.done():
                self._task.result()
            assert time.monotonic() < deadline, "uvicorn did not start within 10 s"
            await asyncio.sleep(0.005)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None and self._task is not None
        self._server.should_exit = True
        await self._task


@dataclass
class Seen:
    """One request a :class:`Scripted` endpoint read."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Reply:
    """One scripted answer: a status, headers, a body, and an optional hold before answering."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"ok"
    hold: asyncio.Event | None = None
    close: bool = False


class Scripted:
    """An endpoint answering the next reply of its script (the last one repeats)."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies) or [Reply()]
        self.seen: list[Seen] = []
        self.arrived = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        self.seen.append(Seen(scope["method"], scope["path"], headers, body, time.time()))
        self.arrived.set()
        reply = self.replies[min(len(self.seen) - 1, len(self.replies) - 1)]
        if reply.hold is not None:
            await reply.hold.wait()
        raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.items()]
        if reply.close:
            raw.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": reply.status, "headers": raw})
        await send({"type": "http.response.body", "body": reply.body})


def free_port(host: str = "127.0.0.1") -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
