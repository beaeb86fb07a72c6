"""Who may look, who may act: the auth guard, CSRF tokens, basic auth and response headers.

The guard is a pure ASGI middleware around the whole dashboard, static files included, so no
route can be reached without the ``auth`` hook answering an actor (a route-level dependency was
rejected: a route added later, or a mount such as the static files, could forget it).

CSRF: every page sets a random nonce cookie (``HttpOnly``, ``SameSite=Strict``) and embeds in its
forms an HMAC of that nonce and the actor's id under the app's secret. A POST must carry both, and
they must agree (OWASP's signed double-submit cookie). A plain double-submit (the nonce itself in
the form) was rejected: a sibling subdomain that can write cookies could then forge both halves.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import inspect
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeAlias

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from jobs_core.tenancy import Actor

AuthHook: TypeAlias = Callable[[Request], "Actor | Awaitable[Actor | None] | None"]
"""``(request) -> Actor | None`` (or a coroutine answering one): ``None`` refuses with 401."""

CSRF_COOKIE = "jobs_dashboard_csrf"
"""The cookie holding the CSRF nonce."""

CSRF_FIELD = "csrf"
"""The form field holding the CSRF token."""

SECURITY_HEADERS: Mapping[str, str] = {
    # No inline script or style is served, so a markup injection that slipped past escaping
    # still could not run.
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}
"""Headers every dashboard response carries."""


async def resolve_actor(auth: AuthHook, request: Request) -> Actor | None:
    """Call ``auth`` (sync or async) and answer its actor."""
    found = auth(request)
    if inspect.isawaitable(found):
        found = await found
    if found is not None and not isinstance(found, Actor):
        raise TypeError(f"the dashboard's auth hook answered {type(found).__name__}, not Actor")
    return found


class Guard:
    """ASGI middleware: refuse every HTTP request the ``auth`` hook answers ``None`` for (401).

    The actor is stored in ``scope["state"]["actor"]`` (``request.state.actor``). A hook with a
    ``www_authenticate`` attribute (as :func:`basic_auth` has) gets it sent with the 401, so a
    browser asks for credentials.

    Args:
        app: the dashboard.
        auth: the hook.
    """

    def __init__(self, app: ASGIApp, auth: AuthHook) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Authenticate an HTTP request, then pass it on (other scopes pass as they are)."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        actor = await resolve_actor(self.auth, Request(scope, receive))
        if actor is None:
            challenge = getattr(self.auth, "www_authenticate", None)
            headers = {"www-authenticate": challenge} if isinstance(challenge, str) else {}
            refused = PlainTextResponse("authentication required", 401, headers=headers)
            await refused(scope, receive, send)
            return
        scope.setdefault("state", {})["actor"] = actor
        await self.app(scope, receive, send)


class BasicAuth:
    """An ``auth`` hook checking HTTP Basic credentials (RFC 7617) against fixed users.

    Each user becomes ``Actor(id=<user name>)``. Passwords compare in constant time. Serve it over
    TLS (or on loopback only): Basic credentials travel in clear otherwise.

    Args:
        users: user name to password.
        realm: the realm a browser shows when it asks.
    """

    def __init__(self, users: Mapping[str, str], realm: str = "jobs-dashboard") -> None:
        if not users or any(not user or ":" in user or not pw for user, pw in users.items()):
            raise ValueError("basic_auth needs at least one user, names without ':', no empty pw")
        self._users = {user: pw.encode() for user, pw in users.items()}
        self.www_authenticate = f'Basic realm="{realm}", charset="UTF-8"'

    def __call__(self, request: Request) -> Actor | None:
        """Answer the actor the request's ``Authorization: Basic`` header names, or ``None``."""
        scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, sep, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        expected = self._users.get(user)
        # Compare against something even for an unknown user, so timing does not tell users.
        ok = hmac.compare_digest(password.encode(), expected or b"\0" * 16)
        return Actor(id=user) if sep and expected is not None and ok else None


def basic_auth(user: str, password: str, *, realm: str = "jobs-dashboard") -> BasicAuth:
    """Answer an ``auth`` hook admitting one user by HTTP Basic credentials.

    Args:
        user: the user name (no ``:``); it becomes the actor id in the action log.
        password: the password (non-empty).
        realm: what the browser's prompt shows.

    Raises:
        ValueError: for an empty user or password, or a user name holding ``:``.
    """
    return BasicAuth({user: password}, realm=realm)


class Csrf:
    """Issue and check CSRF tokens (see the module docstring).

    Args:
        secret: the HMAC key; ``None`` draws a random one (tokens then die with the process,
            and replicas behind one load balancer need a shared secret).
    """

    def __init__(self, secret: str | bytes | None = None) -> None:
        if secret is None:
            self._key = secrets.token_bytes(32)
        else:
            self._key = secret.encode() if isinstance(secret, str) else bytes(secret)

    def nonce(self, request: Request) -> tuple[str, bool]:
        """Answer the request's nonce and whether it is new (so the cookie must be set)."""
        found = request.cookies.get(CSRF_COOKIE, "")
        if 20 <= len(found) <= 100:
            return found, False
        return secrets.token_urlsafe(32), True

    def token(self, nonce: str, actor: Actor) -> str:
        """Answer the form token of ``nonce`` for ``actor``."""
        mac = hmac.new(self._key, f"{nonce}\0{actor.id}".encode(), hashlib.sha256)
        return mac.hexdigest()

    def valid(self, request: Request, form: Mapping[str, Any], actor: Actor) -> bool:
        """Answer whether ``form`` carries the token of the request's nonce cookie."""
        nonce = request.cookies.get(CSRF_COOKIE)
        sent = form.get(CSRF_FIELD)
        if not nonce or not isinstance(sent, str):
            return False
        return hmac.compare_digest(sent, self.token(nonce, actor))

    def set_cookie(self, response: Response, nonce: str, path: str) -> None:
        """Set the nonce cookie on ``response`` (scoped to the dashboard's ``path``)."""
        response.set_cookie(
            CSRF_COOKIE, nonce, path=path or "/", httponly=True, samesite="strict", secure=False
        )
