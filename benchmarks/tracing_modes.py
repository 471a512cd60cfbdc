"""The tracing modes the benchmarks compare (``--tracing``): ``off`` sets
``saga_tracing = False``; ``api`` leaves it unset with the OpenTelemetry API and no tracer
provider (what a team without an SDK has: nothing is traced); ``sdk`` sets an SDK tracer
provider whose exporter drops every span (what tracing itself costs, without a
collector's). The package never sets a provider: the process does it here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MODES = ("off", "api", "sdk")


def setting(mode: str) -> bool | None:
    """The ``saga_tracing`` setting of ``mode`` (after setting its provider)."""
    if mode not in MODES:
        raise ValueError(f"tracing mode {mode!r}: one of {', '.join(MODES)}")
    if mode == "sdk":
        _drop_every_span()
    return False if mode == "off" else None


def _drop_every_span() -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class Dropped(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)
