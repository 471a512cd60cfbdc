"""Flower 2, run as its own process against the worker's events, shows a saga's steps as the
user's own tasks: a failed step is a FAILURE under its task name, a body stopped by a cancel
is REVOKED, and a run is searchable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flower.events import EventsState

from celery_saga import CancelVerdict, ExecutionState
from tests.conftest import ROOT, Harness
from tests.faults import free_port


def _get(port: int, path: str, **query: str) -> Any:
    url = f"http://127.0.0.1:{port}{path}?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _until(probe: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        try:
            found = probe()
        except OSError:  # not listening yet (URLError is an OSError)
            found = None
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"Flower did not show {what} within {seconds} s")
        time.sleep(0.25)


@pytest.fixture
def flower(harness: Harness, tmp_path: Any) -> Iterator[int]:
    """A ``celery flower`` on a free port, watching the harness's broker."""
    if harness.in_process:
        pytest.skip("the in-process backend sends no task events for Flower to read")
    if harness.name != "postgres-rabbitmq":
        pytest.skip("Flower reads the same events on every broker: one server backend is enough")
    env = harness.process_env(FLOWER_UNAUTHENTICATED_API="true")
    port = free_port()
    command = [sys.executable, "-m", "celery", "-A", "tests.sagaapp:app", "flower"]
    command += [f"--port={port}", "--address=127.0.0.1"]
    with open(tmp_path / "flower.log", "wb") as log:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        # Flower only sees the events sent after it connects: wait until the harness's
        # workers' heartbeats have reached it, so its event consumer is known to be running.
        queue = harness.test_app.app.conf.task_default_queue
        _until(
            lambda: (
                sum(
                    alive and queue in name
                    for name, alive in _get(port, "/api/workers", status="true").items()
                )
                == len(harness.workers)
            ),
            30,
            "the harness's workers alive",
        )
        yield port
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)


@pytest.fixture
def flower_state(harness: Harness) -> Iterator[tuple[EventsState, list[tuple[str, str]]]]:
    """Flower's own state machine (``EventsState``), fed by the workers' event stream as
    Flower's ``Events`` thread feeds it (an ``EventReceiver`` handing every event to
    ``state.event``); with the (task id, event type) pairs in the order they came."""
    if harness.name != "postgres-rabbitmq":
        pytest.skip("task events of real workers: one server backend is enough")
    app = harness.test_app.app
    state = EventsState(max_tasks_in_memory=10000)
    seen: list[tuple[str, str]] = []

    def on_event(event: dict[str, Any]) -> None:
        if event["type"].startswith("task-"):
            seen.append((event["uuid"], event["type"]))
        state.event(event)

    with app.connection_for_read() as connection:
        receiver = app.events.Receiver(connection, handlers={"*": on_event})
        consumer = threading.Thread(
            target=lambda: receiver.capture(limit=None, timeout=None, wakeup=True), daemon=True
        )
        consumer.start()
        try:
            # Only events sent after the receiver's queue exists arrive: wait for heartbeats.
            queue = app.conf.task_default_queue
            _until(
                lambda: (
                    sum(queue in name and w.alive for name, w in list(state.workers.items()))
                    == len(harness.workers)
                ),
                30,
                "the harness's workers alive",
            )
            yield state, seen
        finally:
            receiver.should_stop = True
            consumer.join(10)


#: A body the cancel stops: between its ticks (mostly in ``time.sleep``), or inside a query,
#: whose rollback then raises the error that leaves the body (the stop in its context).
BODIES = {
    "ticking": ({"sleep": 30, "tick": True}, "tick"),
    "in a query": ({"mark_begin": True, "query_sleep": 30}, "forward_begin"),
}


def _cancelled_mid_body(
    harness: Harness, saga: str, step: str, order: int, body: str = "ticking"
) -> tuple[Any, str]:
    """Start ``saga`` with ``step``'s body running for 30 s (``BODIES``) and cancel the run
    once it runs; the run's handle and the id of the body's task."""
    plan, begun = BODIES[body]
    run = harness.start(saga, {"order": order, "plan": {step: plan}})
    entries = harness.test_app.entries
    _until(lambda: any(e.direction == begun for e in entries(run.id)), 30, f"{step} running")
    holder = harness.engine.get(run.id).step(step).holder or ""
    assert harness.engine.cancel(run.id, "fraud suspected") is CancelVerdict.CANCEL
    return run, holder.rsplit("/", 1)[-1]


@pytest.mark.parametrize("body", list(BODIES))
def test_a_body_stopped_by_a_cancel_ends_revoked_in_flowers_state(
    harness: Harness, flower_state: tuple[EventsState, list[tuple[str, str]]], body: str
) -> None:
    """docs/cancellation.md: the cancel revokes the body's task (Celery's terminate, which
    announces ``task-revoked``); the stopped task must send nothing that Flower ranks above
    REVOKED (``task-succeeded``, ``task-failed``), whatever error the stop left the body
    with (stopped inside a query, the rollback's ``OperationalError``)."""
    state, seen = flower_state
    run, stopped = _cancelled_mid_body(harness, "failed_eligible", "b", 11, body)
    assert run.wait(60).state is ExecutionState.CANCELLED
    # Both reversals ran after the stopped task ended: its own events were sent before theirs.
    undone = _until(
        lambda: [
            t
            for t in list(state.tasks.values())
            if t.name == "failed_eligible.a.compensate"
            and t.state == "SUCCESS"
            and run.id in (t.kwargs or "")
        ],
        20,
        "the reversal of a",
    )
    assert undone
    time.sleep(1.0)
    events = [kind for task_id, kind in list(seen) if task_id == stopped]
    assert "task-revoked" in events, events
    assert state.tasks[stopped].state == "REVOKED", events
    assert not {"task-succeeded", "task-failed"} & set(events), events
    # The run's other messages (the duplicates that ran nothing among them) still end in a
    # final state, not left STARTED.
    mine = [t for t in list(state.tasks.values()) if run.id in (t.kwargs or "")]
    assert not [t.name for t in mine if t.state in ("STARTED", "RECEIVED")]


def test_a_timeout_that_no_revoke_announced_ends_failure_in_flowers_state(
    harness: Harness,
    flower_state: tuple[EventsState, list[tuple[str, str]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A body the cancel's stop never reached runs on until its own ``timeout=``, in a run
    being cancelled: no worker announced its task REVOKED, so the task ends as any timed-out
    attempt does (FAILURE, ``StepTimeoutError``), never left STARTED."""
    state, seen = flower_state
    monkeypatch.setattr(harness.engine.executor.holders, "stop", lambda holder: None)
    run, timed_out = _cancelled_mid_body(harness, "timed", "slow", 12)
    assert run.wait(60).state is ExecutionState.CANCELLED  # after slow's timeout, 5 s in
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and state.tasks[timed_out].state == "STARTED":
        time.sleep(0.25)
    events = [kind for task_id, kind in list(seen) if task_id == timed_out]
    assert state.tasks[timed_out].state == "FAILURE", events
    assert str(state.tasks[timed_out].exception).startswith("StepTimeoutError"), events
    assert "task-revoked" not in events, events


def test_flower_shows_a_failed_step_as_failure_under_the_users_task_name(
    harness: Harness, flower: int
) -> None:
    run = harness.start("feat_hooks", {"order": 5})
    assert run.wait(30).state is ExecutionState.FAILED
    # The run's messages, found by its execution id: the step messages' kwargsrepr names it,
    # and Flower's task-filter syntax matches ``kwargs:key=value`` against a kwargs dict.
    search = f"kwargs:execution_id={run.id}"

    def failed() -> dict[str, Any]:
        tasks = _get(flower, "/api/tasks", search=search, state="FAILURE")
        return {i: t for i, t in tasks.items() if t["name"] == "features.boom"}

    # One FAILURE: the step's duplicate message (the harness sends each twice) ran no body.
    (boom,) = _until(failed, 20, "the failed step").values()
    assert "warehouse refused order 5" in boom["exception"]
    assert run.id in boom["kwargs"]
    tasks = _until(
        lambda: _get(flower, "/api/tasks", search=search, taskname="features.hooked"),
        20,
        "the succeeded step",
    )
    assert "SUCCESS" in {t["state"] for t in tasks.values()}
    # A bare id is a substring search over every field, kwargs included.
    plain = _get(flower, "/api/tasks", search=run.id)
    assert {t["name"] for t in plain.values()} >= {"features.hooked", "features.boom"}
    assert all(run.id in t["kwargs"] for t in plain.values())

    # Every message of the run ends in a final state, the duplicates that ran nothing too.
    def unfinished() -> list[str]:
        tasks = _get(flower, "/api/tasks", search=run.id)
        return [t["name"] for t in tasks.values() if t["state"] in ("STARTED", "RECEIVED")]

    _until(lambda: not unfinished() or None, 20, "every message of the run to finish")


def test_flower_shows_a_reversal_rooted_at_the_failed_step(harness: Harness, flower: int) -> None:
    """docs/operations.md: a reversal's root (and the first one's parent) is the failed step
    whose end started the unwind, not the run's first step."""
    run = harness.start("feat_hooks", {"order": 6})
    assert run.wait(30).state is ExecutionState.FAILED
    search = f"kwargs:execution_id={run.id}"

    def named(name: str, state: str) -> dict[str, Any]:
        tasks = _get(flower, "/api/tasks", search=search, state=state)
        return {i: t for i, t in tasks.items() if t["name"] == name}

    failed = _until(lambda: named("features.boom", "FAILURE"), 20, "the failed step")
    ((boom_id, boom),) = failed.items()
    reversals = _until(lambda: named("features.undo_hooked", "SUCCESS"), 20, "the reversal")
    firsts = _until(lambda: named("features.hooked", "SUCCESS"), 20, "the first step")
    # The forward run keeps Celery's root: the first step (each duplicate is its own root).
    assert boom["root_id"] in {t["root_id"] for t in firsts.values()} - {boom_id}
    assert {(t["root_id"], t["parent_id"]) for t in reversals.values()} == {(boom_id, boom_id)}


def test_flower_search_lists_runs_joined_with_or_and_a_name_link_finds_the_same(
    harness: Harness, flower: int
) -> None:
    """docs/operations.md: ``PARENT OR CHILD`` lists both runs' tasks, and the
    ``/tasks?name=ID%20OR%20ID`` link (searching ``name:ID OR ID``) the same as ``ID``."""
    first = harness.start("feat_result", {"order": 61})
    second = harness.start("feat_result", {"order": 62})
    for run in (first, second):
        assert run.wait(30).state is ExecutionState.COMPLETED

    def ids(query: str) -> set[str]:
        return set(_get(flower, "/api/tasks", search=query))

    alone = {
        run.id: _until(lambda run=run: ids(run.id), 20, f"the tasks of {run.id}")
        for run in (first, second)
    }
    assert not alone[first.id] & alone[second.id]
    both = alone[first.id] | alone[second.id]
    assert _until(lambda: ids(f"{first.id} OR {second.id}") >= both or None, 20, "both runs")
    assert ids(f"name:{first.id} OR {first.id}") == ids(first.id)


def test_flower_holds_no_value_a_saga_marks_sensitive(harness: Harness, flower: int) -> None:
    """docs/redaction.md: a marked run's tasks in Flower (kwargs, result, exception,
    traceback) show its marked values only as ``[redacted]``."""
    from tests.redaction_sagas import token_of

    card, address, order = "4242-4242-4242-4242", "7 Secret Lane", 8123
    run = harness.start("private", {"order": order, "card": card, "address": address})
    assert run.wait(60).state is ExecutionState.FAILED

    def settled() -> dict[str, Any] | None:
        tasks = _get(flower, "/api/tasks", search=run.id)
        names = {t["name"] for t in tasks.values() if t["state"] in ("SUCCESS", "FAILURE")}
        return tasks if {"private.tokenize", "private.charge"} <= names else None

    tasks = _until(settled, 30, "the marked run's tasks")
    seen = json.dumps(tasks)
    assert "[redacted]" in seen
    for secret in (card, address, token_of(order)):
        assert secret not in seen
