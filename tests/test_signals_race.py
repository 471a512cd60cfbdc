"""Guarantees 13, 14, 16: a signal counts once per (execution, event), resumes a waiting run
exactly once, and is never lost between "is it there?" and "park"."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest

from celery_saga import (
    DefinitionError,
    DuplicateSignalError,
    ExecutionNotFoundError,
    ExecutionState,
    InvalidStateError,
    PayloadError,
    Saga,
    UnknownEventError,
)
from celery_saga.decisions.admission import NodeMessage
from celery_saga.store import waits as waits_store
from celery_saga.store.tables import signals
from tests.conftest import Harness


def _waiting(harness: Harness, order: int) -> Any:
    run = harness.start("approval", {"order": order})
    execution = run.wait(30)
    assert execution.state is ExecutionState.WAITING, harness.worker_logs()
    return run


def _signal_rows(engine: Any, execution_id: str) -> int:
    with engine.db.transaction() as connection:
        rows = connection.execute(signals.select().where(signals.c.execution_id == execution_id))
        return len(rows.all())


def _concurrently(*calls: Any) -> list[Any]:
    """Run the calls in threads released together; each result or raised error, in order."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[Any] = [None] * len(calls)

    def run(index: int, call: Any) -> None:
        barrier.wait()
        try:
            outcomes[index] = call()
        except Exception as error:
            outcomes[index] = error

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return outcomes


def test_signal_resumes_the_waiting_run_and_its_payload_reaches_later_steps(
    harness: Harness,
) -> None:
    run = _waiting(harness, 60)
    assert harness.engine.signal(run.id, "approved", {"by": "ann"}) is True
    execution = run.wait(30)
    assert execution.state is ExecutionState.COMPLETED, harness.worker_logs()
    assert execution.results["ship"] == {"signals": {"approved": {"by": "ann"}}}
    assert execution.record.wake_at is None


def test_two_concurrent_signals_resume_once_and_the_second_is_refused(harness: Harness) -> None:
    run = _waiting(harness, 61)
    engine = harness.engine
    outcomes = _concurrently(
        lambda: engine.signal(run.id, "approved", {"by": "ann"}),
        lambda: engine.signal(run.id, "approved", {"by": "bob"}),
    )
    assert sorted(map(repr, outcomes)).count("True") == 1, outcomes
    refused = [o for o in outcomes if isinstance(o, DuplicateSignalError)]
    assert len(refused) == 1, outcomes
    execution = run.wait(30)
    assert execution.state is ExecutionState.COMPLETED, harness.worker_logs()
    ships = [e for e in harness.test_app.entries(run.id) if e.step == "ship"]
    assert len(ships) == 1, "one resume, so the step after the gate ran once"
    assert _signal_rows(engine, run.id) == 1


def test_second_signal_with_same_event_is_refused_and_changes_nothing(harness: Harness) -> None:
    run = _waiting(harness, 62)
    harness.engine.signal(run.id, "approved", "first")
    execution = run.wait(30)
    with pytest.raises(DuplicateSignalError, match=r"'approved'.*already received"):
        harness.engine.signal(run.id, "approved", "second")
    after = run.get()
    assert after.record.version == execution.record.version
    assert after.results["ship"] == {"signals": {"approved": "first"}}


def test_signal_with_no_payload_counts_as_received(harness: Harness) -> None:
    run = _waiting(harness, 63)
    assert harness.engine.signal(run.id, "approved") is True
    execution = run.wait(30)
    assert execution.state is ExecutionState.COMPLETED
    assert execution.results["ship"] == {"signals": {"approved": None}}


def test_signal_to_an_unknown_or_terminal_run_is_refused_and_stores_nothing(
    harness: Harness,
) -> None:
    with pytest.raises(ExecutionNotFoundError, match="no saga execution"):
        harness.engine.signal(f"nope-{uuid.uuid4().hex}", "approved")
    done = harness.start("five", {"order": 64}).wait(30)
    with pytest.raises(UnknownEventError, match="has no wait_for"):
        harness.engine.signal(done.id, "approved")
    failed = harness.start("approval", {"order": 65, "plan": {"charge": {"fail": True}}}).wait(30)
    assert failed.state is ExecutionState.FAILED
    with pytest.raises(InvalidStateError, match="the run is failed"):
        harness.engine.signal(failed.id, "approved")
    assert _signal_rows(harness.engine, failed.id) == 0
    assert harness.engine.get(failed.id).record.version == failed.record.version


def test_signal_for_an_event_the_saga_does_not_wait_for_is_refused(harness: Harness) -> None:
    run = _waiting(harness, 66)
    with pytest.raises(UnknownEventError, match=r"'rejected'.*its events: 'approved'"):
        harness.engine.signal(run.id, "rejected")
    with pytest.raises(PayloadError, match="payload of signal 'approved'"):
        harness.engine.signal(run.id, "approved", {"not", "storable"})
    assert _signal_rows(harness.engine, run.id) == 0
    assert run.get().state is ExecutionState.WAITING


def test_a_signal_sent_before_the_gate_is_kept_and_the_run_passes_the_gate(
    harness: Harness,
) -> None:
    run = harness.start("two_gates", {"order": 67})
    assert run.wait(30).state is ExecutionState.WAITING
    assert harness.engine.signal(run.id, "second", 2) is False, "stored for the later gate"
    assert run.get().state is ExecutionState.WAITING, "the run still waits at the first gate"
    assert harness.engine.signal(run.id, "first", 1) is True
    execution = run.wait(30)
    assert execution.state is ExecutionState.COMPLETED, harness.worker_logs()
    assert execution.results["after"] == {"signals": {"first": 1, "second": 2}}


def test_signals_racing_runs_as_they_park_resume_each_run_exactly_once(harness: Harness) -> None:
    engine, rng = harness.engine, random.Random(14)
    runs = [harness.start("approval", {"order": 700 + i}) for i in range(8)]

    def racer(run_id: str, delay: float) -> Any:
        def send() -> Any:
            time.sleep(delay)
            return engine.signal(run_id, "approved", delay)

        return send

    calls = []
    for run in runs:
        delay = rng.uniform(0, 0.4)
        calls += [racer(run.id, delay), racer(run.id, delay)]
    outcomes = _concurrently(*calls)
    for index, run in enumerate(runs):
        pair = outcomes[2 * index : 2 * index + 2]
        assert sum(isinstance(o, DuplicateSignalError) for o in pair) == 1, pair
        assert run.wait(30).state is ExecutionState.COMPLETED, harness.worker_logs()
        ships = Counter(e.step for e in harness.test_app.entries(run.id))
        assert ships["ship"] == 1


def test_two_gates_with_one_event_are_refused_at_definition() -> None:
    saga = Saga("twice").wait_for("approved").step("a", lambda: None).wait_for("approved")
    with pytest.raises(DefinitionError, match="two wait_for gates wait for 'approved'"):
        saga.seal()


# -- the race between a signal and the run parking itself, forced --------------------------


def _gate_saga(engine: Any) -> str:
    name = f"gate{uuid.uuid4().hex[:6]}"
    engine.register(Saga(name).wait_for("go").step("after", lambda: "after"))
    return name


def test_a_signal_landing_between_the_check_and_the_park_is_not_lost(
    direct: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = direct
    saga = _gate_saga(engine)
    run = engine.start(saga)
    real, armed, sent = waits_store._received, [True], []

    def signal_in_the_window(connection: Any, execution_id: str, event: str) -> Any:
        found = real(connection, execution_id, event)
        if armed and execution_id == run.id:
            armed.clear()  # the park's own check: the signal now lands right after it
            sender = threading.Thread(target=lambda: sent.append(engine.signal(run.id, "go")))
            sender.start()
            sender.join(0.5)  # a correct park holds the run's row: the signal must wait
            sent.append(sender)
        return found

    monkeypatch.setattr(waits_store, "_received", signal_in_the_window)
    engine.executor.run_node(NodeMessage(run.id, 0, 0, 0, 1), saga)
    sent[-1].join(30)
    assert True in sent, "the signal that waited for the park resumed the run"
    execution = engine.get(run.id)
    assert execution.state is ExecutionState.RUNNING
    assert (execution.record.cursor, execution.record.wake_at) == (1, None)


def test_a_signal_before_the_park_lets_the_run_pass_the_gate_at_once(direct: Any) -> None:
    engine = direct
    saga = _gate_saga(engine)
    run = engine.start(saga)
    assert engine.signal(run.id, "go") is False
    engine.executor.run_node(NodeMessage(run.id, 0, 0, 0, 1), saga)
    execution = engine.get(run.id)
    assert (execution.state, execution.record.cursor) == (ExecutionState.RUNNING, 1)


def test_concurrent_signals_on_the_store_resume_once(direct: Any) -> None:
    engine = direct
    saga = _gate_saga(engine)
    run = engine.start(saga)
    engine.executor.run_node(NodeMessage(run.id, 0, 0, 0, 1), saga)
    assert engine.get(run.id).state is ExecutionState.WAITING
    outcomes = _concurrently(*(lambda i=i: engine.signal(run.id, "go", i) for i in range(4)))
    assert outcomes.count(True) == 1, outcomes
    assert sum(isinstance(o, DuplicateSignalError) for o in outcomes) == 3, outcomes
    assert engine.get(run.id).record.cursor == 1
