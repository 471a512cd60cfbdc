"""One trace per run over real prefork workers, on RabbitMQ and on Redis: the SDK exports
each worker process's spans to a file (``tests/traced_app.py``), the test process's own
(the caller's span, the root, the signal's wait) to memory.

The run: five steps, the 4th failing once (retried), the 5th for good (four reversals),
a sub-saga and a wait signalled after a second. Its spans: exactly one trace, no span
whose parent is missing, one span per attempt and per reversal, each reversal linked to
its forward attempt, and the caller's span the root's parent. The same after a SIGKILL of
the worker mid-step (the lost attempt's span is never exported: the re-run's is, with
the next attempt number), a SIGTERM mid-reversal, a 30 s store outage, a parked unwind
resumed from another process and a hand-back between versions; with Celery's own
instrumentation, ours nest in its task spans. No marked field's plaintext in any span.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

from celery_saga import ExecutionState
from tests.conftest import (
    BROKERS,
    PORTS,
    _spawn_workers,
    _test_database_url,
    _wait_ready,
    client_app,
    require_services,
    spawn_beat,
    stop_workers,
)
from tests.deploy_rig import DeployRig
from tests.redaction_sagas import token_of
from tests.traced_app import define_traced
from tests.tracing_kit import (
    check_one_trace,
    collected,
    in_trace_of,
    run_span_names,
    sdk_provider,
)

PLAN = {"t4": {"fail_attempts": 1}, "t5": {"fail": True}}


class TracedRig:
    """Workers of ``tests.traced_app`` on ``broker``, with a real beat sending the sweeps
    (a lost message is sent again on Redis by the recovery sweep)."""

    def __init__(self, broker: str, tmp: Path, celery_spans: bool) -> None:
        self.tmp, self.queue = tmp, f"saga-trace-{uuid.uuid4().hex[:10]}"
        self.spans = tmp / "spans"
        self.spans.mkdir()
        self.env = {
            **os.environ,
            "SAGA_TEST_BROKER": broker,
            "SAGA_TEST_STORE": _test_database_url(),
            "SAGA_TEST_QUEUE": self.queue,
            "SAGA_TEST_DUPLICATE": "0",
            "SAGA_TEST_LEASE": "3",
            "SAGA_TEST_RECOVER_AFTER": "3",
            "SAGA_TEST_SWEEP_INTERVAL": "1",
            "SAGA_TEST_SPANS": str(self.spans),
            "SAGA_TEST_OTEL_CELERY": "1" if celery_spans else "0",
            "PYTHONPATH": str(Path.cwd()),
        }
        self.client = client_app(self.env, broker, self.env["SAGA_TEST_STORE"], self.queue)
        define_traced(self.client)
        self.workers: list[subprocess.Popen[bytes]] = []
        self.beat = spawn_beat(self.env, tmp)

    def start_worker(self) -> subprocess.Popen[bytes]:
        logdir = self.tmp / f"gen{len(self.workers)}"
        logdir.mkdir()
        workers, _ = _spawn_workers(
            self.env, self.queue, logdir, count=1, app="tests.traced_app:app"
        )
        self.workers.extend(workers)
        _wait_ready(self.client, 1, workers)
        return workers[0]

    def run_until(self, execution_id: str, *states: ExecutionState) -> Any:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            execution = self.client.engine.get(execution_id)
            if execution.state in states:
                return execution
            time.sleep(0.2)
        logs = "".join(
            f"\n--- {log.relative_to(self.tmp)} (its last 60 lines)\n"
            + "\n".join(log.read_text(errors="replace").splitlines()[-60:])
            for log in sorted([*self.tmp.glob("gen*/worker*.log"), self.tmp / "beat.log"])
            if log.exists()
        )
        raise AssertionError(f"run {execution_id} never got to {states}: {execution.state}{logs}")

    def close(self) -> None:
        stop_workers([*self.workers, self.beat])
        with self.client.app.connection_for_write() as connection:
            connection.default_channel.queue_purge(self.queue)


@pytest.fixture(params=["postgres-rabbitmq", "postgres-redis"])
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TracedRig]:
    require_services(PORTS["postgres"], PORTS[request.param])
    rig = TracedRig(BROKERS[request.param], tmp_path, celery_spans=False)
    try:
        yield rig
    finally:
        rig.close()


def _traced_run(rig: TracedRig, before_signal: Callable[[Any], None] | None = None) -> Any:
    """Start the run under a caller's span, signal its wait a second after it parks, and
    wait for its unwind to end; returns the run's id and every span of its trace."""
    with sdk_provider() as memory:
        tracer = trace.get_tracer("test")
        with tracer.start_as_current_span("POST /orders") as caller:
            run = rig.client.engine.start("traced", {"plan": PLAN})
        if before_signal is not None:
            before_signal(run)
        rig.run_until(run.id, ExecutionState.WAITING)
        time.sleep(1)
        rig.client.engine.signal(run.id, "go", {})
        ended = rig.run_until(run.id, ExecutionState.FAILED)
        assert ended.rollback_status is not None and ended.rollback_status.value == "completed"
        time.sleep(0.5)  # the last reversal's task ends after it is recorded
        spans = collected(memory, rig.spans)
    return run.id, *in_trace_of(caller, spans), spans


def _check_the_run(run_id: str, trace_id: str, mine: list[dict[str, Any]]) -> None:
    caller = next(s for s in mine if s["name"] == "POST /orders")
    assert check_one_trace(mine) == trace_id
    root = next(s for s in mine if s["name"] == "saga traced")
    assert root["parent"] == caller["id"]
    assert root["attributes"]["saga.execution_id"] == run_id
    ours = run_span_names(mine)
    assert ours == {
        "saga traced": 1,
        "saga traced_kid": 1,
        **{f"step t{n}": 1 for n in (1, 2, 3, 5)},
        "step t4": 2,
        "step k1": 1,
        **{f"reversal t{n}": 1 for n in (1, 2, 3, 4)},
        "reversal k1": 1,
        "wait go": 1,
        "operator signal": 1,
    }
    t4 = sorted(s["attributes"]["saga.attempt"] for s in mine if s["name"] == "step t4")
    assert t4 == [1, 2]


def test_one_trace_per_run_over_prefork_workers(rig: TracedRig) -> None:
    rig.start_worker()
    run_id, trace_id, mine, everything = _traced_run(rig)
    _check_the_run(run_id, trace_id, mine)
    # Nothing of the run in another trace.
    strays = [s["name"] for s in everything if s not in mine and s["attributes"].get("saga.name")]
    assert strays == []


def test_the_trace_holds_after_a_sigkill_mid_step(rig: TracedRig) -> None:
    """The worker's process group dies while t2's body sleeps: the attempt's span is lost
    with it (never exported); the re-run is attempt 2, in the same trace."""
    worker = rig.start_worker()
    PLAN["t2"] = {"first_sleep": 8, "mark_begin": True}
    try:

        def kill_mid_step(run: Any) -> None:
            def begun() -> bool:
                return any(
                    e.step == "t2" and e.direction == "forward_begin"
                    for e in rig.client.entries(run.id)
                )

            deadline = time.monotonic() + 45
            while not begun():
                assert time.monotonic() < deadline
                time.sleep(0.05)
            time.sleep(0.5)
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)
            rig.start_worker()

        run_id, trace_id, mine, _ = _traced_run(rig, kill_mid_step)
    finally:
        del PLAN["t2"]
    _check_the_run(run_id, trace_id, mine)
    (t2,) = [s for s in mine if s["name"] == "step t2"]
    assert t2["attributes"]["saga.attempt"] == 2
    assert t2["attributes"]["saga.lost_attempt"] == 1


def test_a_parked_run_resumed_from_another_process_stays_in_its_trace(rig: TracedRig) -> None:
    """The unwind parks (p1's reversal fails); this process resumes it under a span of
    another trace: the move is a span of the run's trace, linked to that span, and the
    reversal it sends runs in the run's trace."""
    rig.start_worker()
    switch = f"park-{uuid.uuid4().hex[:8]}"
    rig.client.set_switch(switch, True)
    plan = {"p1": {"undo_switch": switch}, "p3": {"fail": True}}
    with sdk_provider() as memory:
        tracer = trace.get_tracer("test")
        with tracer.start_as_current_span("POST /orders") as caller:
            run = rig.client.engine.start("traced_park", {"plan": plan})
        rig.run_until(run.id, ExecutionState.COMPENSATION_STUCK)
        rig.client.set_switch(switch, False)
        with tracer.start_as_current_span("operator clicks resume") as operator:
            rig.client.engine.resume_compensation(run.id, actor="oncall")
        ended = rig.run_until(run.id, ExecutionState.FAILED)
        assert ended.rollback_status.value == "completed"
        time.sleep(0.5)
        spans = collected(memory, rig.spans)
    _, mine = in_trace_of(caller, spans)
    check_one_trace(mine)
    ours = run_span_names(mine)
    assert ours == {
        "saga traced_park": 1,
        **{f"step p{n}": 1 for n in (1, 2, 3)},
        "reversal p2": 1,
        "reversal p1": 2,
        "operator resume_compensation": 1,
    }
    resume = next(s for s in mine if s["name"] == "operator resume_compensation")
    assert resume["attributes"]["saga.actor"] == "oncall"
    asked_by = format(operator.get_span_context().span_id, "016x")
    assert [link["id"] for link in resume["links"]] == [asked_by]
    outcomes = sorted(
        (s["attributes"]["saga.attempt"], s["attributes"]["saga.outcome"])
        for s in mine
        if s["name"] == "reversal p1"
    )
    # A resume gives the reversal a fresh set of attempts (docs/compensation.md).
    assert outcomes == [(1, "failed"), (1, "ran")]


def test_a_sigterm_mid_reversal_keeps_the_trace(rig: TracedRig) -> None:
    """The worker's process group gets SIGTERM while p1's reversal sleeps: its span ends
    ``interrupted``, the message sent again runs attempt 2 in the same trace, linked to
    the same forward attempt."""
    worker = rig.start_worker()
    plan = {"p3": {"fail": True}, "p1": {"undo_first_sleep": 8, "undo_mark_begin": True}}
    with sdk_provider() as memory:
        tracer = trace.get_tracer("test")
        with tracer.start_as_current_span("POST /orders") as caller:
            run = rig.client.engine.start("traced_park", {"plan": plan})
        deadline = time.monotonic() + 45
        while not any(e.direction == "compensate_begin" for e in rig.client.entries(run.id)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)
        rig.start_worker()
        rig.run_until(run.id, ExecutionState.FAILED)
        time.sleep(0.5)
        spans = collected(memory, rig.spans)
    _, mine = in_trace_of(caller, spans)
    check_one_trace(mine)
    undo = sorted(
        (s["attributes"]["saga.attempt"], s["attributes"]["saga.outcome"])
        for s in mine
        if s["name"] == "reversal p1"
    )
    assert undo == [(1, "interrupted"), (2, "ran")]
    strays = [s["name"] for s in spans if s not in mine and s["attributes"].get("saga.name")]
    assert strays == []


def test_no_plaintext_of_a_marked_field_in_a_span_of_any_worker(rig: TracedRig) -> None:
    """``private`` marks its input's card and address and tokenize's whole result; charge
    fails naming all three, detokenize's first attempt names the token: every attribute
    and event of every exported span is swept for them."""
    rig.start_worker()
    order = 4503
    card, address = "4000-0566-5566-5556", "7 Hidden Mews"
    with sdk_provider() as memory:
        run = rig.client.engine.start("private", {"order": order, "card": card, "address": address})
        rig.run_until(run.id, ExecutionState.FAILED)
        time.sleep(0.5)
        spans = collected(memory, rig.spans)
    mine = [s for s in spans if s["attributes"].get("saga.execution_id") == run.id]
    assert {"step charge", "reversal tokenize"} <= {s["name"] for s in mine}
    events = [e for s in mine for e in s["events"]]
    assert any("declined" in str(e["attributes"]) for e in events), "the failure is there"
    exported = json.dumps(spans)
    for secret in (card, address, token_of(order)):
        assert secret not in exported


def test_a_run_handed_back_between_versions_stays_in_its_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of version 2 started while only a worker of version 1 runs: its messages are
    handed back until a worker with version 2 starts, which runs them in the run's trace."""
    require_services(PORTS["postgres"], PORTS["postgres-rabbitmq"])
    folder = tmp_path / "spans"
    folder.mkdir()
    monkeypatch.setenv("SAGA_TEST_SPANS", str(folder))
    rig = DeployRig(BROKERS["postgres-rabbitmq"], _test_database_url(), tmp_path)
    try:
        rig.start_worker("old", "1")
        with sdk_provider() as memory:
            with trace.get_tracer("test").start_as_current_span("POST /deploys") as caller:
                (run_id,) = rig.start("2", 1)
            deadline = time.monotonic() + 30
            while "handed back" not in rig.log("old"):
                assert time.monotonic() < deadline, rig.log("old")
                time.sleep(0.2)
            rig.start_worker("new", "1,2")
            ended = rig.drive([run_id], timeout=90)
            assert ended[run_id].state is ExecutionState.COMPLETED
            time.sleep(0.5)
            spans = collected(memory, folder)
    finally:
        rig.close()
    _, mine = in_trace_of(caller, spans)
    check_one_trace(mine)
    strays = [s["name"] for s in spans if s not in mine and s["attributes"].get("saga.name")]
    assert strays == []
    steps = Counter(s["name"] for s in mine if s["attributes"].get("saga.direction") == "step")
    names = ("reserve", "fraud", "stock", "tick:0", "tick:1", "card", "audit", "bill")
    assert steps == {f"step {n}": 1 for n in names}


def test_a_30_s_store_outage_while_a_step_records_its_result_keeps_the_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """p2's body cuts the store for 30 s just before its result is recorded: the record
    waits the outage out inside the attempt's span, and the run goes on in its trace."""
    from tests import test_faults

    folder = tmp_path / "spans"
    folder.mkdir()
    monkeypatch.setenv("SAGA_TEST_SPANS", str(folder))
    traced = functools.partial(_spawn_workers, app="tests.traced_app:app")
    monkeypatch.setattr(test_faults, "_spawn_workers", traced)
    rig = test_faults.FaultRig(tmp_path)
    define_traced(rig.client)
    try:
        plan = {"p2": {"cut_after": 30}, "p3": {"fail": True}}
        with sdk_provider() as memory:
            with trace.get_tracer("test").start_as_current_span("POST /orders") as caller:
                run = rig.client.engine.start("traced_park", {"plan": plan})
            ended = rig.wait_terminal(run.id, timeout=180)
            assert ended.state is ExecutionState.FAILED
            assert rig.proxy.cuts, "the step's body did cut the store"
            time.sleep(0.5)
            spans = collected(memory, folder)
    finally:
        rig.close()
    _, mine = in_trace_of(caller, spans)
    check_one_trace(mine)
    ours = run_span_names(mine)
    assert ours == {
        "saga traced_park": 1,
        **{f"step p{n}": 1 for n in (1, 2, 3)},
        **{f"reversal p{n}": 1 for n in (1, 2)},
    }


@pytest.fixture
def instrumented_rig(tmp_path: Path) -> Iterator[TracedRig]:
    require_services(PORTS["postgres"], PORTS["postgres-rabbitmq"])
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    rig = TracedRig(BROKERS["postgres-rabbitmq"], tmp_path, celery_spans=True)
    CeleryInstrumentor().instrument()
    try:
        yield rig
    finally:
        CeleryInstrumentor().uninstrument()
        rig.close()


def test_with_celery_instrumentation_our_spans_nest_in_its_task_spans(
    instrumented_rig: TracedRig,
) -> None:
    instrumented_rig.start_worker()
    run_id, trace_id, mine, _ = _traced_run(instrumented_rig)
    _check_the_run(run_id, trace_id, mine)
    by_id = {s["id"]: s for s in mine}
    steps = [s for s in mine if s["attributes"].get("saga.direction") == "step"]
    # Each attempt's parent is the task span Celery's instrumentation opened for it.
    parents = [by_id[s["parent"]] for s in steps]
    assert all(p["name"].startswith("run/") for p in parents), [p["name"] for p in parents]
