"""Prometheus metrics count real runs: scraped as exposition text, in-process and from a
prefork worker exporting its children's counters (multiprocess mode)."""

from __future__ import annotations

import os
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from celery_saga import ExecutionState, Saga, step
from celery_saga.decisions.admission import NodeMessage
from celery_saga.metrics import enable_metrics
from tests.conftest import (
    BROKERS,
    PORTS,
    _spawn_workers,
    _test_database_url,
    _wait_ready,
    require_services,
    stop_workers,
)
from tests.faults import free_port
from tests.sagaapp import TestApp


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(found: dict[Any, float], name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_count_runs_steps_and_reversals_of_real_runs(
    saga_engine: Any, saga_kit: Any
) -> None:
    registry = CollectorRegistry()
    enable_metrics(saga_engine, registry=registry)
    attempts: dict[str, int] = {}

    def flaky(ctx: Any) -> str:
        attempts[ctx.execution_id] = attempts.get(ctx.execution_id, 0) + 1
        if attempts[ctx.execution_id] == 1:
            raise ConnectionError("try again")
        return "ok"

    def refuse(ctx: Any) -> None:
        if ctx.input.get("fail"):
            raise ValueError("no")

    def undo_badly(ctx: Any) -> None:
        if ctx.input.get("stuck"):
            raise RuntimeError("cannot undo")

    saga_engine.register(
        Saga("metered")
        .step("book", lambda ctx: 1, compensate=undo_badly, compensation_retry=1)
        .step("pay", flaky, retry=2, backoff=0.01)
        .for_each(lambda ctx: [1, 2], step("pack", lambda ctx: ctx.item))
        .step("check", refuse)
    )
    assert saga_kit.run("metered").state is ExecutionState.COMPLETED
    assert saga_kit.run("metered", {"fail": True}).state is ExecutionState.FAILED
    stuck = saga_kit.run("metered", {"fail": True, "stuck": True})
    assert stuck.state is ExecutionState.COMPENSATION_STUCK
    # The run is parked in the store before its event is counted: wait for the count.
    deadline = time.monotonic() + 10
    found = samples(generate_latest(registry).decode())
    while not value(found, "saga_runs_parked_total", saga="metered") and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
        found = samples(generate_latest(registry).decode())
    assert value(found, "saga_runs_started_total", saga="metered") == 3
    assert value(found, "saga_runs_completed_total", saga="metered") == 1
    assert value(found, "saga_runs_failed_total", saga="metered", rollback_status="completed") == 1
    assert value(found, "saga_runs_parked_total", saga="metered") == 1
    step_count = "saga_step_duration_seconds_count"
    assert value(found, step_count, saga="metered", step="pay", outcome="retry") == 3
    assert value(found, step_count, saga="metered", step="pay", outcome="completed") == 3
    assert value(found, step_count, saga="metered", step="pack", outcome="completed") == 6
    assert value(found, step_count, saga="metered", step="check", outcome="failed") == 2
    reversal = "saga_reversal_duration_seconds_count"
    assert value(found, reversal, saga="metered", step="book", outcome="compensated") == 1
    assert value(found, reversal, saga="metered", step="book", outcome="failed") == 1
    assert (
        value(
            found, "saga_step_duration_seconds_sum", saga="metered", step="pay", outcome="completed"
        )
        > 0
    )
    resolved = "saga_reversals_resolved_total"
    assert value(found, resolved, saga="metered", step="book") == 0
    saga_engine.resolve(stuck.execution.id, step="book", note="released by hand")
    found = samples(generate_latest(registry).decode())
    assert value(found, resolved, saga="metered", step="book") == 1


def _scrape(port: int, wanted: str, deadline: float) -> str:
    text = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
                text = reply.read().decode()
        except OSError:
            pass
        if wanted in text:
            return text
        time.sleep(0.2)
    return text


def test_a_prefork_worker_exports_its_childrens_counters(tmp_path: Path) -> None:
    require_services(PORTS["postgres"], PORTS["postgres-rabbitmq"])
    store, broker = _test_database_url(), BROKERS["postgres-rabbitmq"]
    queue = f"saga-metrics-{uuid.uuid4().hex[:10]}"
    test_app = TestApp(broker, store, queue)
    test_app.engine.ensure_schema()
    port = free_port()
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    env = {
        **os.environ,
        "SAGA_TEST_BROKER": broker,
        "SAGA_TEST_STORE": store,
        "SAGA_TEST_QUEUE": queue,
        "SAGA_TEST_METRICS_PORT": str(port),
        "PROMETHEUS_MULTIPROC_DIR": str(multiproc),
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    }
    workers, logs = _spawn_workers(env, queue, tmp_path, count=1)
    try:
        _wait_ready(test_app, 1, workers)
        runs = [test_app.engine.start("five", {"order": n}) for n in range(3)]
        failing = test_app.engine.start("five", {"order": 9, "plan": {"s4": {"fail": True}}})
        # A duplicate of a run's first message: the run is still counted once.
        first = test_app.engine.definition("five").find_step("s1")
        duplicate = NodeMessage(runs[0].id, 0, 0, 0, 1)
        test_app.engine.executor.publisher.publish_node("five", first, duplicate)
        for run in [*runs, failing]:
            assert run.wait(30).state in (ExecutionState.COMPLETED, ExecutionState.FAILED)
        text = _scrape(
            port,
            'saga_runs_failed_total{rollback_status="completed",saga="five"}',
            time.monotonic() + 15,
        )
    finally:
        stop_workers(workers)
        with test_app.app.connection_for_write() as connection:
            connection.default_channel.queue_purge(queue)
        test_app.engine.db.dispose()  # the server's connection slots are shared
    log = "\n".join(p.read_text(errors="replace")[-3000:] for p in logs)
    found = samples(text)
    assert value(found, "saga_runs_completed_total", saga="five") == 3, (text, log)
    # Started in this process, which has no exporter: counted where the worker took them.
    assert value(found, "saga_runs_started_total", saga="five") == 4, (text, log)
    assert value(found, "saga_runs_failed_total", saga="five", rollback_status="completed") == 1
    assert value(found, "saga_store_up") == 1, "the store's gauges are served beside them"
    count = "saga_step_duration_seconds_count"
    assert value(found, count, saga="five", step="s1", outcome="completed") == 4
    assert value(found, count, saga="five", step="s4", outcome="failed") == 1
    assert (
        value(
            found,
            "saga_reversal_duration_seconds_count",
            saga="five",
            step="s3",
            outcome="compensated",
        )
        == 1
    )


def test_the_recovery_sweep_counts_the_runs_it_picks_up(tmp_path: Path, saga_clock: Any) -> None:
    from celery_saga import SagaEngine
    from tests.conftest import unconsumed_app

    # Nobody consumes this app's queue: the first message is lost, as after a broker crash.
    engine = SagaEngine(unconsumed_app("metrics"), store_url=f"sqlite:///{tmp_path}/s.sqlite3")
    registry = CollectorRegistry()
    enable_metrics(engine, registry=registry)
    engine.register(Saga("lost").step("only", lambda ctx: 1))
    engine.start("lost", {})
    engine.start("lost", {})
    assert engine.recover(stale_after=60) == 0
    saga_clock.advance(61)
    assert engine.recover(stale_after=60) == 2
    found = samples(generate_latest(registry).decode())
    assert value(found, "saga_sweep_recoveries_total", saga="lost") == 2
    # Stored, but no worker took their first node: not counted as started (yet).
    assert value(found, "saga_runs_started_total", saga="lost") == 0
    engine.db.dispose()
