"""The app of the tracing tests' worker processes: the test app (``tests.sagaapp``) with
the sagas ``traced`` and ``traced_kid``, and an SDK tracer provider that writes every
finished span as a JSON line in the folder ``SAGA_TEST_SPANS`` names (a file per process).
With ``SAGA_TEST_OTEL_CELERY=1``, Celery's own instrumentation runs too."""

from __future__ import annotations

import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from celery_saga import Saga
from tests.sagaapp import TestApp, from_environment
from tests.tracing_kit import JsonLinesExporter


def define_traced(test_app: TestApp) -> None:
    """Five steps (the 4th retried once on failure) around a sub-saga and a wait; and
    three whose unwind parks when a switch makes the first one's reversal fail."""
    fwd, rev = test_app.forward, test_app.reverse
    test_app.engine.register(
        Saga("traced_kid").step("k1", fwd, compensate=rev),
        Saga("traced")
        .step("t1", fwd, compensate=rev)
        .step("t2", fwd, compensate=rev)
        .sub_saga("traced_kid")
        .wait_for("go", timeout=120)
        .step("t3", fwd, compensate=rev)
        .step("t4", fwd, compensate=rev, retry=2, backoff=0.5)
        .step("t5", fwd),
        Saga("traced_park")
        .step("p1", fwd, compensate=rev, compensation_retry=1)
        .step("p2", fwd, compensate=rev)
        .step("p3", fwd),
    )


def trace_to_files(folder: str, celery: bool) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(folder)))
    trace.set_tracer_provider(provider)
    if celery:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        CeleryInstrumentor().instrument()


if "SAGA_TEST_SPANS" in os.environ:
    trace_to_files(os.environ["SAGA_TEST_SPANS"], os.environ.get("SAGA_TEST_OTEL_CELERY") == "1")
if "SAGA_TEST_BROKER" in os.environ:
    _test_app = from_environment()
    define_traced(_test_app)
    app = _test_app.app
