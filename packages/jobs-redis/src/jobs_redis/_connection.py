"""Clients, script calls and the refusal rule: a server that cannot be reached fails the call now.

Design notes (the alternatives that were rejected):

* **Fail fast, reconnect lazily.** Clients are built with a short connect timeout, a bounded
  command timeout and no retry, so a call made while Redis is down raises
  ``DriverUnavailableError`` (``X_DRIVER_UNAVAILABLE``) at once instead of queueing in memory or
  waiting for the connection to come back (FIELD-FAILURES C12). The pool dials afresh on the next
  call, so a restarted server is used with no process restart. redis-py's built-in retries were
  rejected: each one multiplies the time a caller waits before it hears "down".
* **One client per event loop.** redis-py's asyncio connections belong to the loop that opened
  them. A sync caller's ``enqueue_sync`` runs each call on a fresh loop, and the conformance suite
  drives drivers from several threads, so a single shared client would be handed sockets of a
  closed loop. A closed loop's client is dropped when the next loop's client is built (a
  ``WeakKeyDictionary`` was rejected: the client's connections hold their loop, so the entries
  would never go).
* **The command timeout bounds the whole call, not each socket operation.** redis-py's own
  ``socket_timeout`` would do, but on Python 3.11 it wraps every send in ``asyncio.wait_for``,
  which runs the send in a task of its own: two more loop passes per command, on the path of
  every claim and enqueue. One ``asyncio.timeout`` around the call (dial, handshake, send and
  reply) bounds the same waits with none; a call cut short closes its connection (redis-py
  drops a connection whose read was cancelled), so no late reply is read by the next command.
* **A connection the server closed is dialled again once.** After a restart every pooled
  connection is dead, and the first command on each fails with "Connection closed by server"
  although the server is up (issue 14 item 3). A command failing with a connection error is sent
  once more, after the pool's idle connections are dropped, on a freshly dialled one; a server
  that is down refuses that dial at once, so the refusal stays immediate. The command may have
  run if only its reply was lost: every script is either fenced (settles, heartbeats, steps) or
  dedupes on ids (enqueue), and a claim whose reply was lost leaves rows leased to a worker that
  never heard of them, which lapse and are claimed again, as any lost reply does.
* **A cluster is a URL scheme, not a second driver.** ``redis+cluster://host:port`` (or
  ``rediss+cluster://``) builds redis-py's ``RedisCluster`` from that one seed node instead of a
  ``Redis``; every script call names a key of the prefix's hash tag, so the cluster client
  routes it to the master holding that slot, and nothing else changes. Its own retries are off
  (as for a single server); a connection error makes it refresh its slot map, and the one
  resend below goes to whatever master holds the slot now.
* **A server's own error reply passes through** (``redis.exceptions.ResponseError``): it says
  something is wrong with the request or the server's state (``OOM``, ``READONLY``), not that the
  server is away, and retrying the call elsewhere would not help.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException
from redis.exceptions import TimeoutError as RedisTimeoutError

from jobs_core.errors import DriverUnavailableError
from jobs_redis._scripts import Script

UNAVAILABLE: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    TimeoutError,
)
"""Errors meaning the server could not be reached or did not answer in time."""

_MAYBE_UNAVAILABLE: tuple[type[BaseException], ...] = (*UNAVAILABLE, RedisClusterException)
"""What :func:`_unreachable` sorts: an outage, or a cluster client's error that may be one."""

T = TypeVar("T")

Client = aioredis.Redis | aioredis.RedisCluster
"""A client the driver calls through: one server, or a Redis Cluster."""

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
"""URL schemes naming a Redis Cluster seed node, and the plain scheme redis-py is given."""


def is_cluster_url(url: str) -> bool:
    """Answer whether ``url`` names a Redis Cluster (``redis+cluster://``/``rediss+cluster://``)."""
    return url.partition("://")[0] in CLUSTER_SCHEMES


async def prepare(client: Client) -> None:
    """Load a cluster client's slot map if it has none yet (a no-op for one server).

    redis-py's ``RedisCluster`` loads it on its first command, but a pub/sub made before any
    command cannot route its ``SUBSCRIBE`` without it.

    Raises:
        redis.exceptions.ConnectionError: no seed node answered (the cluster cannot be reached).
    """
    if isinstance(client, aioredis.RedisCluster):
        try:
            await client.initialize()
        except RedisClusterException as exc:
            if _unreachable(exc):
                raise RedisConnectionError(str(exc)) from exc
            raise


def _unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` means the server (or every cluster seed node) could not be reached."""
    if isinstance(exc, UNAVAILABLE):
        return True
    # A cluster client that reached no seed node says so with its own exception type.
    return isinstance(exc, RedisClusterException) and isinstance(exc.__cause__, UNAVAILABLE)


def open_client(url: str, **options: Any) -> Client:
    """Answer a redis-py asyncio client for ``url``: a ``RedisCluster`` for a cluster URL.

    Args:
        url: ``redis://``, ``rediss://``, or ``redis+cluster://host:port`` /
            ``rediss+cluster://host:port`` (one seed node; the client finds the other masters).
        **options: keywords for redis-py's ``from_url`` (``decode_responses=True`` and so on).

    Nothing is dialled until the first command.
    """
    scheme, sep, rest = url.partition("://")
    if scheme in CLUSTER_SCHEMES:
        return aioredis.RedisCluster.from_url(f"{CLUSTER_SCHEMES[scheme]}{sep}{rest}", **options)
    return aioredis.Redis.from_url(url, **options)


class Connection:
    """The driver's clients (one per event loop) and its script calls.

    Args:
        url: a ``redis://`` or ``rediss://`` URL, or ``redis+cluster://``/``rediss+cluster://``
            naming one seed node of a Redis Cluster.
        connect_timeout_s: how long dialling may take (seconds).
        command_timeout_s: how long one command may wait for its reply (seconds).
        given: a ready client the app built (it keeps its own connect, retry and pool
            behaviour; calls made while its server is away still raise ``X_DRIVER_UNAVAILABLE``).
            It is used from its own event loop and is not closed by :meth:`close`.
    """

    def __init__(
        self,
        url: str,
        connect_timeout_s: float,
        command_timeout_s: float,
        given: Client | None = None,
    ) -> None:
        """Keep the settings; nothing is dialled until the first call."""
        self.url = url
        self._connect_timeout_s = connect_timeout_s
        self._command_timeout_s = command_timeout_s
        self._clients: dict[asyncio.AbstractEventLoop, Client] = {}
        self._given = given
        self.closed = False

    def client(self) -> Client:
        """Answer the running loop's client, building it on first use.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` after :meth:`close`.
        """
        if self.closed:
            raise DriverUnavailableError("the redis driver is closed", driver="redis")
        if self._given is not None:
            return self._given
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            for gone in [other for other in self._clients if other.is_closed()]:
                del self._clients[gone]
            client = open_client(
                self.url,
                decode_responses=True,
                socket_connect_timeout=self._connect_timeout_s,
                # No per-socket-operation timeout (redis-py's default is 5 s): see the notes above.
                socket_timeout=None,
                retry=Retry(NoBackoff(), 0),
            )
            self._clients[loop] = client
        return client

    def deadline(self) -> asyncio.Timeout:
        """Answer the bound on one call made with :meth:`client` (raises ``TimeoutError``)."""
        return asyncio.timeout(self._command_timeout_s)

    def unavailable(self, exc: BaseException) -> DriverUnavailableError:
        """Answer the refusal raised in place of a connection failure ``exc``."""
        return DriverUnavailableError(
            f"redis at {self.safe_url()} cannot be reached ({type(exc).__name__}: {exc}); "
            "nothing was changed by this call unless a reply was lost in flight",
            driver="redis",
            error=type(exc).__name__,
        )

    def safe_url(self) -> str:
        """Answer the URL without its password, for messages and ``describe()``."""
        scheme, sep, rest = self.url.partition("://")
        if "@" not in rest:
            return self.url
        return f"{scheme}{sep}***@{rest.rpartition('@')[2]}"

    async def call(self, send: Callable[[Client], Awaitable[T]]) -> T:
        """Answer ``send(client)`` within the command timeout, sent again once on a failure.

        A connection error (a stale pooled connection the server closed) drops the pool's idle
        connections and sends once more on a freshly dialled one.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
            redis.exceptions.ResponseError: the server's own error reply, unmapped.
        """
        client = self.client()
        try:
            async with self.deadline():
                try:
                    await prepare(client)
                    return await send(client)
                except RedisConnectionError:
                    # Every idle pooled connection predates the failure: drop them all, so
                    # the next command dials a fresh one instead of meeting another stale one.
                    # A cluster client has dropped the failed node's idle connections itself
                    # and refreshes its slot map before the resend.
                    if isinstance(client, aioredis.Redis):
                        await client.connection_pool.disconnect(inuse_connections=False)
                    await prepare(client)
                    return await send(client)
        except _MAYBE_UNAVAILABLE as exc:
            if not _unreachable(exc):
                raise
            raise self.unavailable(exc) from exc

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Call ``script`` by SHA; load it once if the server does not have it.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
            redis.exceptions.ResponseError: the server's own error reply, unmapped.
        """

        async def send(client: Client) -> Any:
            try:
                return await _evalsha(client, script, keys, args)
            except NoScriptError:
                await client.script_load(script.text)
                return await _evalsha(client, script, keys, args)

        return await self.call(send)

    async def run_all(
        self, script: Script, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """Call ``script`` once per ``(keys, args)`` inside one ``MULTI``/``EXEC``: all or none.

        Every call names the same script, so a server without it refuses each one with NOSCRIPT
        and nothing runs; the script is then loaded and the whole transaction sent again.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
            redis.exceptions.ResponseError: the server's own error reply, unmapped.
        """

        async def send(client: Client) -> list[Any]:
            try:
                return await _transaction(client, script, calls)
            except NoScriptError:
                await client.script_load(script.text)
                return await _transaction(client, script, calls)

        return await self.call(send)

    async def load_all(self, scripts: Sequence[Script]) -> None:
        """``SCRIPT LOAD`` every script now (a reachability check at connect time).

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        client = self.client()
        try:
            for script in scripts:
                async with self.deadline():
                    await prepare(client)
                    await client.script_load(script.text)
        except _MAYBE_UNAVAILABLE as exc:
            if not _unreachable(exc):
                raise
            raise self.unavailable(exc) from exc

    async def close(self) -> None:
        """Refuse every later call and close the running loop's client.

        Clients of other loops are dropped; their sockets close when those loops' objects go.
        """
        self.closed = True
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        clients = dict(self._clients)
        self._clients.clear()
        client = clients.get(loop) if loop is not None else None
        if client is not None:
            await client.aclose()


async def _evalsha(client: Client, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
    return await client.evalsha(script.sha, len(keys), *keys, *args)


async def _transaction(
    client: Client, script: Script, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
) -> list[Any]:
    async with client.pipeline(transaction=True) as pipe:
        for keys, args in calls:
            # redis-py's cluster pipeline blocks its ``evalsha`` method; the raw command is
            # the same EVALSHA, and every call's keys share the prefix's slot.
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        return await pipe.execute()
