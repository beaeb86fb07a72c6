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
from redis.exceptions import NoScriptError
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

T = TypeVar("T")


class Connection:
    """The driver's clients (one per event loop) and its script calls.

    Args:
        url: a ``redis://`` or ``rediss://`` URL.
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
        given: aioredis.Redis | None = None,
    ) -> None:
        """Keep the settings; nothing is dialled until the first call."""
        self.url = url
        self._connect_timeout_s = connect_timeout_s
        self._command_timeout_s = command_timeout_s
        self._clients: dict[asyncio.AbstractEventLoop, aioredis.Redis] = {}
        self._given = given
        self.closed = False

    def client(self) -> aioredis.Redis:
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
            client = aioredis.Redis.from_url(
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

    async def call(self, send: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
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
                    return await send(client)
                except RedisConnectionError:
                    # Every idle pooled connection predates the failure: drop them all, so
                    # the next command dials a fresh one instead of meeting another stale one.
                    await client.connection_pool.disconnect(inuse_connections=False)
                    return await send(client)
        except UNAVAILABLE as exc:
            raise self.unavailable(exc) from exc

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Call ``script`` by SHA; load it once if the server does not have it.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
            redis.exceptions.ResponseError: the server's own error reply, unmapped.
        """

        async def send(client: aioredis.Redis) -> Any:
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

        async def send(client: aioredis.Redis) -> list[Any]:
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
                    await client.script_load(script.text)
        except UNAVAILABLE as exc:
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


async def _evalsha(
    client: aioredis.Redis, script: Script, keys: Sequence[str], args: Sequence[Any]
) -> Any:
    return await client.evalsha(script.sha, len(keys), *keys, *args)


async def _transaction(
    client: aioredis.Redis, script: Script, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
) -> list[Any]:
    async with client.pipeline(transaction=True) as pipe:
        for keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        return await pipe.execute()
