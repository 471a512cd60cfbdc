"""OpenTelemetry tracing of saga runs: one trace per run (``docs/tracing.md``).

On the OpenTelemetry API only (the ``otel`` extra); the package never configures an
exporter. ``Tracer`` is the one home of every span the runtime opens: the runtime calls it
at its boundaries (a run's start, an attempt, a wait, an operator's move) and it does
nothing, at no store cost, when tracing is off. ``TraceIdsFilter`` puts the current trace
and span ids on log records for a log format."""

from celery_saga.tracing.logs import TraceIdsFilter
from celery_saga.tracing.spans import Tracer, trace_id_of

__all__ = ["TraceIdsFilter", "Tracer", "trace_id_of"]
