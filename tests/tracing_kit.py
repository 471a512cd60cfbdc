"""What the tracing tests share: a tracer provider set for one test (the API sets one per
process, for good: the test puts the API's state back after), spans written as JSON lines
by worker processes, and the checks of one run's trace."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


@contextmanager
def sdk_provider(exporter: SpanExporter | None = None) -> Iterator[InMemorySpanExporter]:
    """An SDK tracer provider exporting to memory (and to ``exporter``), set for the block."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    saved = trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE
    trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = None, Once()
    trace.set_tracer_provider(provider)
    try:
        yield memory
    finally:
        provider.shutdown()
        trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = saved


class JsonLinesExporter(SpanExporter):
    """Each finished span as one JSON line, in a file per process of ``folder`` (opened at
    each span: safe across the pool's forks)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(Path(self.folder) / f"{os.getpid()}.jsonl", "a") as out:
            for span in spans:
                out.write(json.dumps(as_dict(span)) + "\n")
        return SpanExportResult.SUCCESS


def trace_to_files() -> None:
    """In a worker's app module: with ``SAGA_TEST_SPANS`` set, an SDK tracer provider that
    writes every finished span as a JSON line in that folder (a file per process), and
    with ``SAGA_TEST_OTEL_CELERY=1`` Celery's own instrumentation too."""
    folder = os.environ.get("SAGA_TEST_SPANS")
    if folder is None:
        return
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(folder)))
    trace.set_tracer_provider(provider)
    if os.environ.get("SAGA_TEST_OTEL_CELERY") == "1":
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        CeleryInstrumentor().instrument()


def as_dict(span: ReadableSpan) -> dict[str, Any]:
    """What the checks read of a span, the same from memory and from a file."""
    context, parent = span.get_span_context(), span.parent
    return {
        "name": span.name,
        "trace": format(context.trace_id, "032x"),
        "id": format(context.span_id, "016x"),
        "parent": format(parent.span_id, "016x") if parent else None,
        "attributes": dict(span.attributes or {}),
        "events": [{"name": e.name, "attributes": dict(e.attributes or {})} for e in span.events],
        "links": [
            {"id": format(link.context.span_id, "016x"), "attributes": dict(link.attributes or {})}
            for link in span.links
        ],
        "status": span.status.status_code.name,
        "start": span.start_time,
        "end": span.end_time,
    }


def finished_spans(memory: InMemorySpanExporter) -> list[dict[str, Any]]:
    """Every span ``memory`` holds, as ``as_dict`` gives it."""
    return [as_dict(s) for s in memory.get_finished_spans()]


def read_spans(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted(folder.glob("*.jsonl")) for line in f.open()]


def collected(memory: InMemorySpanExporter, folder: Path) -> list[dict[str, Any]]:
    """This process's spans and the worker processes' (written to ``folder``)."""
    return [as_dict(s) for s in memory.get_finished_spans()] + read_spans(folder)


def in_trace_of(caller: Any, spans: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The trace id of the span ``caller`` and the spans in that trace."""
    trace_id = format(caller.get_span_context().trace_id, "032x")
    return trace_id, [s for s in spans if s["trace"] == trace_id]


def run_span_names(spans: list[dict[str, Any]]) -> Counter[str]:
    """How many spans of each name are about a run (all but the callers')."""
    return Counter(s["name"] for s in spans if s["attributes"].get("saga.execution_id"))


def of_run(spans: list[dict[str, Any]], execution_id: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["attributes"].get("saga.execution_id") == execution_id]


def check_one_trace(spans: list[dict[str, Any]], caller: dict[str, Any] | None = None) -> str:
    """Every span in one trace, every parent among them (no orphan; ``caller``: the span
    that called ``start``, the root's parent), each reversal linked to a forward attempt
    of its step; returns the trace id."""
    traces = {s["trace"] for s in spans}
    assert len(traces) == 1, f"spans in {len(traces)} traces: {_names(spans)}"
    known = {s["id"] for s in spans} | ({caller["id"]} if caller else set())
    orphans = [s["name"] for s in spans if s["parent"] is not None and s["parent"] not in known]
    assert not orphans, f"spans whose parent is not in the trace: {orphans}"
    attempts = {s["id"]: s for s in spans if s["attributes"].get("saga.direction") == "step"}
    for reversal in (s for s in spans if s["attributes"].get("saga.direction") == "reversal"):
        undone = [attempts.get(link["id"]) for link in reversal["links"]]
        steps = [u["attributes"]["saga.step"] for u in undone if u is not None]
        assert steps == [reversal["attributes"]["saga.step"]], reversal
    return traces.pop()


def _names(spans: list[dict[str, Any]]) -> list[str]:
    return sorted(f"{s['name']}@{s['trace'][:6]}" for s in spans)
