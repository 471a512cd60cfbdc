"""``TraceIdsFilter``: the current trace and span ids on every log record, for a format.

Add it to a handler (``handler.addFilter(TraceIdsFilter())``) and use ``%(otel_trace_id)s``
and ``%(otel_span_id)s`` in its format: the engine writes its lines about a run while that
run's span is current (an attempt, a reversal, an operator's move), so they carry the run's
trace; outside a span, while a run's message is handled or a sweep acts on a run, the
run's trace and its root span. Otherwise both are ``0`` (the ids OpenTelemetry's own
logging instrumentation writes then)."""

from __future__ import annotations

import logging

from celery_saga.tracing.api import otel_trace
from celery_saga.tracing.carry import carried


class TraceIdsFilter(logging.Filter):
    """Sets ``otel_trace_id`` (32 hex digits) and ``otel_span_id`` (16) on each record;
    keeps every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        trace_id, span_id = "0", "0"
        context = None if otel_trace is None else otel_trace.get_current_span().get_span_context()
        if context is not None and context.is_valid:
            trace_id = format(context.trace_id, "032x")
            span_id = format(context.span_id, "016x")
        else:  # outside a span, in a run's handling (a sweep's): the run's own trace
            fields = (carried() or "").split("-")
            if len(fields) == 4:
                trace_id, span_id = fields[1], fields[2]
        record.otel_trace_id = trace_id
        record.otel_span_id = span_id
        return True
