"""The OpenTelemetry API, if installed (the ``otel`` extra): every other module of the
package reaches it through here, so a process without it imports the package all the same."""

from __future__ import annotations

from typing import Any

try:
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - the extra is not installed
    otel_trace = None  # type: ignore[assignment]
    TraceContextTextMapPropagator = None  # type: ignore[assignment,misc]

__all__ = ["SCOPE", "carrier_of", "context_of", "installed", "otel_trace", "provider_set"]

#: The package's instrumentation scope name.
SCOPE = "celery_saga"


def installed() -> bool:
    return otel_trace is not None


def provider_set() -> bool:
    """Whether a tracer provider other than the API's no-op (or its proxy, before one is
    set) is in place: the default of ``saga_tracing``."""
    if otel_trace is None:
        return False
    provider = otel_trace.get_tracer_provider()
    return not isinstance(provider, (otel_trace.NoOpTracerProvider, otel_trace.ProxyTracerProvider))


def carrier_of(span_context: Any) -> str | None:
    """The W3C ``traceparent`` of ``span_context`` (None when it is not a valid one)."""
    if otel_trace is None or not span_context.is_valid:
        return None
    carrier: dict[str, str] = {}
    parent = otel_trace.set_span_in_context(otel_trace.NonRecordingSpan(span_context))
    TraceContextTextMapPropagator().inject(carrier, context=parent)
    return carrier.get("traceparent")


def context_of(traceparent: str | None) -> Any:
    """The span context a stored ``traceparent`` names (None for none or a malformed one)."""
    if otel_trace is None or not traceparent:
        return None
    extracted = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
    span_context = otel_trace.get_current_span(extracted).get_span_context()
    return span_context if span_context.is_valid else None
