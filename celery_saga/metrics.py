"""Prometheus metrics for sagas, fed by the engine's event sink (needs the ``prometheus``
extra).

``enable_metrics(engine, port=9808)`` counts runs started (where a worker takes their first
node, ``decisions.openings``), completed, failed and parked, step
and reversal outcomes with their durations (labelled by saga and step; loop iterations share
their step's label), and runs the recovery sweep picked up. With ``port`` an HTTP exporter
starts in each worker's main process when it initialises (never in ``celery saga`` commands
or prefork children). Prefork children keep their own counters, so for the prefork pool set
``PROMETHEUS_MULTIPROC_DIR`` to an empty directory before the worker starts: the children
then write to it and the exporter serves their sum (prometheus_client's multiprocess mode).
See ``docs/metrics.md``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.multiprocess import MultiProcessCollector

from celery_saga.decisions.openings import Opening, opening, opens_run
from celery_saga.definition.nodes import split_iteration
from celery_saga.gauges import StoreGauges
from celery_saga.worker.engine import SagaEngine

#: Seconds; steps are usually calls to other services, reversals likewise.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_STEP_END = {
    "saga-step-completed": "completed",
    "saga-step-failed": "failed",
    "saga-step-retry": "retry",
}
#: The events that may say a worker took a run's first node (``decisions.openings``).
_OPENING_EVENTS = (
    "saga-step-started",
    "saga-waiting",
    "saga-resumed",
    "saga-node-passed",
    "saga-forward-failed",
)
_REVERSAL_END = {
    "saga-step-compensated": "compensated",
    "saga-compensation-failed": "failed",
    "saga-compensation-retry": "retry",
}


#: The openings of every version of a saga this process knows, by saga name.
Openings = Callable[[str], list[Opening]]


class SagaMetrics:
    """An event listener that keeps the counters and histograms; ``registry`` defaults to
    prometheus_client's global one. ``openings`` (``enable_metrics`` passes the engine's):
    runs started are counted where a worker takes their first node; without it, where
    ``start`` is called."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        prefix: str = "saga",
        openings: Openings | None = None,
    ) -> None:
        options: dict[str, Any] = {} if registry is None else {"registry": registry}
        by_saga, by_step = ["saga"], ["saga", "step", "outcome"]
        self.openings = openings
        self.started = Counter(
            f"{prefix}_runs_started", "Runs whose first node a worker took", by_saga, **options
        )
        self.completed = Counter(f"{prefix}_runs_completed", "Runs completed", by_saga, **options)
        self.failed = Counter(
            f"{prefix}_runs_failed",
            "Runs ended failed, by rollback status",
            ["saga", "rollback_status"],
            **options,
        )
        self.parked = Counter(
            f"{prefix}_runs_parked", "Unwinds parked as compensation_stuck", by_saga, **options
        )
        self.resolved = Counter(
            f"{prefix}_reversals_resolved",
            "Parked reversals recorded as done by hand (resolve)",
            ["saga", "step"],
            **options,
        )
        self.steps = Histogram(
            f"{prefix}_step_duration_seconds",
            "Step attempts by outcome (completed, failed, retry)",
            by_step,
            buckets=BUCKETS,
            **options,
        )
        self.reversals = Histogram(
            f"{prefix}_reversal_duration_seconds",
            "Reversal attempts by outcome (compensated, failed, retry)",
            by_step,
            buckets=BUCKETS,
            **options,
        )
        self.cancelled = Counter(
            f"{prefix}_runs_cancelled", "Cancels stored (the run then unwinds)", by_saga, **options
        )
        self.recovered = Counter(
            f"{prefix}_sweep_recoveries", "Runs the recovery sweep picked up", by_saga, **options
        )
        # An attempt starts and ends in the same task, so in the same process.
        self._begun: dict[tuple[str, str, str, Any], float] = {}
        self._lock = threading.Lock()

    def __call__(self, event: str, fields: dict[str, Any]) -> None:
        saga = str(fields.get("saga", ""))
        if self._started(saga, event, fields):
            self.started.labels(saga).inc()
        if event == "saga-completed":
            self.completed.labels(saga).inc()
        elif event == "saga-failed":
            self.failed.labels(saga, str(fields.get("rollback_status"))).inc()
        elif event == "saga-compensation-stuck":
            self.parked.labels(saga).inc()
        elif event == "saga-compensation-resolved":
            self.resolved.labels(saga, str(fields.get("step"))).inc()
        elif event == "saga-recovered":
            self.recovered.labels(saga).inc()
        elif event == "saga-cancelled":
            self.cancelled.labels(saga).inc()
        elif event in ("saga-step-started", "saga-compensation-started"):
            if not fields.get("sub_saga"):  # a child run's span, not a step's attempt
                self._begin(event, fields)
        elif event in _STEP_END:
            self._end("saga-step-started", fields, self.steps, _STEP_END[event])
        elif event in _REVERSAL_END:
            reversal = "saga-compensation-started"
            self._end(reversal, fields, self.reversals, _REVERSAL_END[event])

    def _started(self, saga: str, event: str, fields: dict[str, Any]) -> bool:
        if self.openings is None:
            return event == "saga-started"
        if event not in _OPENING_EVENTS:
            return False
        return opens_run(self.openings(saga), event, fields)

    def _key(self, kind: str, fields: dict[str, Any]) -> tuple[str, str, str, Any]:
        return (
            kind,
            str(fields.get("execution_id")),
            str(fields.get("step")),
            fields.get("attempt"),
        )

    def _begin(self, kind: str, fields: dict[str, Any]) -> None:
        with self._lock:
            self._begun[self._key(kind, fields)] = time.monotonic()

    def _end(self, kind: str, fields: dict[str, Any], into: Histogram, outcome: str) -> None:
        with self._lock:
            began = self._begun.pop(self._key(kind, fields), None)
        if began is None:
            return  # started in another process (a parallel group settled by a sibling)
        step, _ = split_iteration(str(fields.get("step")))
        into.labels(str(fields.get("saga", "")), step, outcome).observe(time.monotonic() - began)


def exporter_registry() -> CollectorRegistry | None:
    """What the exporter serves: the children's sum in multiprocess mode, else the
    default registry (None)."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        return None
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    return registry


def enable_metrics(
    engine: SagaEngine,
    *,
    port: int | None = None,
    address: str = "0.0.0.0",
    registry: CollectorRegistry | None = None,
    store_gauges: bool = True,
) -> SagaMetrics:
    """Count ``engine``'s events; with ``port``, export them from each worker of its app,
    with the store's gauges (``celery_saga.gauges``) unless ``store_gauges`` is False."""
    metrics = SagaMetrics(registry, openings=_openings_of(engine))
    engine.on("*", metrics)
    if port is not None:

        def serve() -> None:
            served = exporter_registry() or _default()
            if store_gauges:
                gauges = StoreGauges(engine.db)
                served.register(gauges)
                gauges.start()
            start_http_server(port, addr=address, registry=served)

        engine.hooks.when_worker_starts(serve)
    return metrics


def _openings_of(engine: SagaEngine) -> Openings:
    """The openings of a saga's versions, worked out once per set of versions: every step
    start asks (a version registered later joins the set)."""
    known: dict[str, tuple[int, list[Opening]]] = {}

    def openings(saga: str) -> list[Opening]:
        versions = engine.catalog.versions(saga)
        seen = known.get(saga)
        if seen is None or seen[0] != len(versions):
            seen = known[saga] = (len(versions), [opening(v.nodes, v.hash) for v in versions])
        return seen[1]

    return openings


def _default() -> CollectorRegistry:
    from prometheus_client import REGISTRY

    return REGISTRY
