"""OpenTelemetry, used only when ``opentelemetry-api`` is installed (``jobs-core[otel]``).

An enqueue stamps the current span's W3C ``traceparent`` on the row
(:func:`current_traceparent`); the worker runs each attempt inside a span that is a child of it
(:func:`attempt_span`), so the job's work joins the trace of the request that asked for it, and
the body's own spans and enqueues nest under the attempt. Without the package both are inert: no
header is stamped and no span is opened, at the cost of one ``None`` check. With the API but no
SDK, a row without a ``traceparent`` opens no span either (it would record nothing).

The header is the W3C text form rather than OpenTelemetry's context object so that a row written
by one process (or language) is read by another; the API's own propagator writes and reads it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from jobs_core.types import ClaimedJob

try:
    from opentelemetry import trace as _trace
    from opentelemetry.environment_variables import OTEL_PYTHON_TRACER_PROVIDER
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:
    _trace = None  # type: ignore[assignment]
    _propagator: Any = None
else:
    _propagator = TraceContextTextMapPropagator()

# ``get_tracer_provider()`` looks ``OTEL_PYTHON_TRACER_PROVIDER`` up in ``os.environ`` at every
# call until a provider is installed: 7 % of a no-op job's worker time. The API installs its
# provider into the module global ``_TRACER_PROVIDER`` (once per process), so while that is unset
# and the variable was not set at start no SDK is installed. Where the global is missing (another
# API version) every call asks the API.
_FAST_SDK_CHECK = (
    _trace is not None
    and hasattr(_trace, "_TRACER_PROVIDER")
    and OTEL_PYTHON_TRACER_PROVIDER not in os.environ
)

FAILED_OUTCOMES = frozenset({"retried", "dead-lettered", "dropped", "refused", "crashed"})
"""Attempt outcomes whose span ends with an error status."""


def tracing_enabled() -> bool:
    """Answer whether ``opentelemetry-api`` was importable when this module loaded."""
    return _trace is not None


def current_traceparent() -> str | None:
    """Answer the current span's W3C ``traceparent`` header, or ``None`` without one.

    ``None`` when OpenTelemetry is not installed, no span is current, or the current span is not
    recording-valid (the API without an SDK yields no context to propagate).
    """
    if _propagator is None:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


_NO_SPAN: AbstractContextManager[Callable[[str], None]] = nullcontext(lambda _outcome: None)
"""What :func:`attempt_span` answers when it opens nothing: its outcome function does nothing."""


def attempt_span(job: ClaimedJob) -> AbstractContextManager[Callable[[str], None]]:
    """Run an attempt inside a ``CONSUMER`` span that is a child of the row's ``traceparent``.

    A row without one starts a new trace. The span is current while the block runs, so the
    body's spans and enqueues are its children. The block gets a function to call with the
    attempt's outcome (an attribute, and an error status for a failure). Without OpenTelemetry
    nothing is opened and the function does nothing.
    """
    if _trace is None or (job.traceparent is None and _without_sdk()):
        # Without an SDK the API's span would be a non-recording copy of the current one (and a
        # row without a traceparent gives it no other parent): opening it changes nothing. The
        # shared no-op context costs no generator per attempt.
        return _NO_SPAN
    return _span(job)


@contextmanager
def _span(job: ClaimedJob) -> Iterator[Callable[[str], None]]:
    """The attempt's span (:func:`attempt_span` with OpenTelemetry and a parent or an SDK)."""
    parent = _propagator.extract({"traceparent": job.traceparent}) if job.traceparent else None
    tracer = _tracer()
    attributes: dict[str, str | int] = {
        "jobs.job.name": job.name,
        "jobs.job.id": str(job.id),
        "jobs.run.id": str(job.run_id),
        "jobs.queue": job.queue,
        "jobs.attempt": job.attempt,
    }
    with tracer.start_as_current_span(
        f"job {job.name}", context=parent, kind=_trace.SpanKind.CONSUMER, attributes=attributes
    ) as span:

        def outcome(value: str) -> None:
            span.set_attribute("jobs.outcome", value)
            if value in FAILED_OUTCOMES:
                span.set_status(_trace.Status(_trace.StatusCode.ERROR, value))

        yield outcome


@functools.cache
def _tracer() -> Any:
    """Answer this library's tracer, looked up once (the lookup reads ``os.environ`` each time).

    Taken before an SDK provider is installed it is the API's proxy tracer, which forwards to the
    provider installed later; the API lets a process install its provider only once.
    """
    return _trace.get_tracer("jobs_core")


def _without_sdk() -> bool:
    """Answer whether no SDK tracer provider is installed (the API's spans record nothing)."""
    if _FAST_SDK_CHECK and _trace._TRACER_PROVIDER is None:
        return True
    return isinstance(
        _trace.get_tracer_provider(), _trace.ProxyTracerProvider | _trace.NoOpTracerProvider
    )
