"""Publishing events that waiting steps (``step.wait_for_event``) resume on.

The bus is the installed driver's stored bus (its ``events`` capability): one clock (the bus's
``now()``) stamps publishes and waits alike, so a worker running ahead of the store still sees an
event published after it began waiting.

Test seams: :func:`reset_event_bus` forgets every event (an event stays matchable until it
expires, so on a bus shared by a test session an answer one test published would resume another
test's wait), and :func:`events_purge_target` hands the bus to a retention sweep.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from jobs_core._current import current_driver
from jobs_core._durations import Duration, parse_duration
from jobs_core.driver import EventBus, PublishRequest, ResettableEventBus, require_capability
from jobs_core.errors import JobOptionsInvalidError, NotImplementedByDriverError
from jobs_core.serialization import NotJSONError, to_json_form
from jobs_core.types import JSONValue, StoredEvent


def current_event_bus() -> EventBus:
    """Answer the installed driver's event bus.

    Raises:
        DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` with no driver installed.
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` when the driver has no event bus.
    """
    bus: EventBus = require_capability(current_driver(), "events")
    return bus


async def publish_event(
    name: str,
    payload: JSONValue,
    *,
    correlation_key: str | None = None,
    ttl: Duration = "7d",
) -> StoredEvent:
    """Publish an event; every run waiting for it (by name and ``match``) resumes.

    Inside the app's open transaction the publish joins it, on a bus that can (pg: the ambient
    connection of ``jobs_pg.transaction(conn)``), so the event commits and rolls back with the
    business rows. Its ``published_at`` is then the statement's time, not the commit's: a wait
    that begins between the publish and its commit starts later than the stamp and does not
    match it (the window is as long as the publishing transaction). The memory bus has no
    transactions: its publish lands at once.

    Args:
        name: the event name (non-empty).
        payload: a JSON-able value (the serialisation rules of steps apply).
        correlation_key: an optional key waits may filter on.
        ttl: how long the event stays matchable (``"7d"``).

    Returns:
        The stored event (its id and the bus's ``published_at``).

    Raises:
        JobOptionsInvalidError: ``X_JOB_OPTIONS_INVALID`` for an empty name, a bad ttl or a
            payload with no JSON form.
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` with no event bus.
    """
    if not isinstance(name, str) or not name or "\x00" in name:
        raise JobOptionsInvalidError(
            "name: an event needs a non-empty name without U+0000", option="name"
        )
    if correlation_key is not None and (
        not isinstance(correlation_key, str) or "\x00" in correlation_key
    ):
        raise JobOptionsInvalidError(
            "correlation_key: must be text without U+0000", option="correlation_key"
        )
    try:
        ttl_ms = parse_duration(ttl, field="ttl")
        body = to_json_form(payload)
    except (ValueError, NotJSONError) as exc:
        raise JobOptionsInvalidError(f"publish_event {name!r}: {exc}") from None
    return await current_event_bus().publish(PublishRequest(name, body, correlation_key, ttl_ms))


async def reset_event_bus(bus: EventBus | None = None) -> int:
    """Delete every event of ``bus`` (default: the installed driver's), expired or not.

    The test seam: call it between tests that share a bus. Waiting steps are untouched; they match
    only events published afterwards.

    Returns:
        How many events were deleted.

    Raises:
        DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` with no ``bus`` and no driver installed.
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` when the driver has no event bus, or
            its bus is not a :class:`~jobs_core.driver.ResettableEventBus`.
    """
    target = current_event_bus() if bus is None else bus
    if not isinstance(target, ResettableEventBus):
        raise NotImplementedByDriverError(
            f"{type(target).__name__} cannot be reset: it has no reset() (ResettableEventBus)",
            capability="events",
        )
    return await target.reset()


@dataclass(frozen=True, slots=True)
class EventsPurgeTarget:
    """An event bus as a retention-sweep target (a ``purge()`` target): expired events go.

    Attributes:
        bus: the bus swept.
        name: the target's name in a sweep (``"events"``).
    """

    bus: EventBus
    name: str = "events"

    async def purge(self, now: datetime | None = None) -> int:
        """Await the bus's ``purge_expired()``; answer how many events it deleted.

        Args:
            now: a purge pass's clock reading, ignored: expiry is decided on the bus's own clock.
        """
        return await self.bus.purge_expired()


def events_purge_target(bus: EventBus, *, name: str = "events") -> EventsPurgeTarget:
    """Answer ``bus`` as a purge target (``await target.purge()`` deletes its expired events).

    Args:
        bus: the event bus, e.g. ``current_event_bus()`` or ``driver.events``.
        name: the target's name (``"events"``); two targets in one sweep need distinct names.

    Raises:
        JobOptionsInvalidError: ``X_JOB_OPTIONS_INVALID`` when ``bus`` is not an ``EventBus`` or
            ``name`` is empty.
    """
    if not isinstance(bus, EventBus):
        raise JobOptionsInvalidError(f"bus: {type(bus).__name__} is not an EventBus", option="bus")
    if not isinstance(name, str) or not name:
        raise JobOptionsInvalidError("name: a purge target needs a non-empty name", option="name")
    return EventsPurgeTarget(bus, name)
