"""Tenancy: the ambient actor, deliberate tenant crossings, and the enqueue-time check.

The actor lives in a :class:`contextvars.ContextVar`, so it follows ``await`` and
``asyncio.create_task`` like a request scope does. The worker installs the job's declared tenant
as the ambient actor for the body, so an app's own tenant guards work inside jobs exactly as in a
request.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from jobs_core.errors import CrossTenantForbiddenError

CROSS_TENANT_PERMISSION = "tenancy:cross"
"""The permission an actor needs to enter :func:`cross_tenant`."""

_log = logging.getLogger("jobs.tenancy")


@dataclass(frozen=True, slots=True)
class Actor:
    """Who is acting.

    Attributes:
        id: the actor's id (recorded as ``enqueued_by``; attribution only).
        org_id: the tenant the actor acts for, or ``None`` for an actor of no org (never compared).
        permissions: e.g. ``{"tenancy:cross"}`` to allow :func:`cross_tenant`.
    """

    id: str
    org_id: str | None = None
    permissions: frozenset[str] = field(default_factory=frozenset)


_actor: ContextVar[Actor | None] = ContextVar("jobs_actor", default=None)
# The crossing in force: the actor that was checked on entry and the reason. The waiver holds only
# while that actor is the ambient one, so code inside the block that switches to an actor without
# the permission (``with acting_as(other):``) gets no waiver.
_crossing: ContextVar[tuple[Actor, str] | None] = ContextVar(
    "jobs_cross_tenant_reason", default=None
)


def current_actor() -> Actor | None:
    """Answer the ambient actor, or ``None`` outside any :func:`acting_as`."""
    return _actor.get()


def crossing_reason() -> str | None:
    """Answer the reason of the :func:`cross_tenant` block in force, or ``None``.

    ``None`` too when the ambient actor is no longer the permitted actor that entered the block.
    """
    crossing = _crossing.get()
    if crossing is None or _actor.get() != crossing[0]:
        return None
    return crossing[1]


@contextmanager
def acting_as(actor: Actor | None) -> Iterator[Actor | None]:
    """Make ``actor`` the ambient actor inside the ``with`` block (``None`` clears it)."""
    token = _actor.set(actor)
    try:
        yield actor
    finally:
        _actor.reset(token)


@contextmanager
def cross_tenant(reason: str) -> Iterator[None]:
    """Waive the AMBIENT tenant check of enqueues inside the block, recording why.

    An explicit ``tenant_id`` or ``enqueue_as`` that contradicts the input is never admitted.

    Args:
        reason: why the crossing is legitimate (logged as ``jobs.tenancy.cross``).

    Raises:
        CrossTenantForbiddenError: ``X_TENANCY_CROSS_FORBIDDEN`` when there is no ambient actor or
            it lacks the ``tenancy:cross`` permission, or the reason is empty.
    """
    actor = _actor.get()
    if not isinstance(reason, str) or not reason.strip():
        raise CrossTenantForbiddenError("cross_tenant needs a non-empty reason")
    if actor is None or CROSS_TENANT_PERMISSION not in actor.permissions:
        raise CrossTenantForbiddenError(
            f"actor {actor.id if actor else None!r} may not cross tenants",
            actor=actor.id if actor else None,
        )
    _log.info(
        "jobs.tenancy.cross",
        extra={"event": "jobs.tenancy.cross", "actor": actor.id, "reason": reason},
    )
    token = _crossing.set((actor, reason))
    try:
        yield
    finally:
        _crossing.reset(token)
