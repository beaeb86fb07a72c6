"""Publishing events that waiting steps (``step.wait_for_event``) resume on.

The bus is the installed driver's stored bus (its ``events`` capability): one clock (the bus's
``now()``) stamps publishes and waits alike, so a worker running ahead of the store still sees an
event published after it began waiting.
"""

from __future__ import annotations

from jobs_core._current import current_driver
from jobs_core._durations import Duration, parse_duration
from jobs_core.driver import EventBus, PublishRequest, require_capability
from jobs_core.errors import JobOptionsInvalidError
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
    if not isinstance(name, str) or not name:
        raise JobOptionsInvalidError("name: an event needs a non-empty name", option="name")
    try:
        ttl_ms = parse_duration(ttl, field="ttl")
        body = to_json_form(payload)
    except (ValueError, NotJSONError) as exc:
        raise JobOptionsInvalidError(f"publish_event {name!r}: {exc}") from None
    return await current_event_bus().publish(PublishRequest(name, body, correlation_key, ttl_ms))
