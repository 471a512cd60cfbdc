"""A step that times out ends its Celery task the way any failed attempt does, sync or
``async def``, on every pool: each attempt's task is a FAILURE with the exception the run's
``failure_reason`` names (``task-failed`` for Flower, ``task_failure`` for error trackers),
never a RETRY of one task id, and the step's next attempt is a task of its own."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import signals

from celery_saga import CancelVerdict, ExecutionState, RollbackStatus
from celery_saga.store import history
from celery_saga.store.history import ATTEMPT_KINDS, HistoryEntry
from tests.conftest import Harness

#: How each message of a task ended: (state, exception type), by (task name, task id).
Endings = dict[tuple[str, str], list[tuple[str, str]]]


@contextmanager
def _worker_events(harness: Harness, names: set[str]) -> Iterator[Callable[[], Endings]]:
    """The endings the harness's worker processes report in their task events (what Flower
    reads), for tasks named in ``names``."""
    app = harness.test_app.app
    captured: list[dict[str, Any]] = []
    with app.connection_for_read() as connection:
        receiver = app.events.Receiver(connection, handlers={"*": captured.append})
        listener = threading.Thread(
            target=receiver.capture, kwargs={"limit": None, "timeout": None, "wakeup": False}
        )
        listener.daemon = True
        listener.start()
        time.sleep(1.0)  # the receiver's queue is bound: events sent from now on reach it

        def endings() -> Endings:
            named = {e["uuid"]: e["name"] for e in captured if e.get("name") in names}
            found: Endings = defaultdict(list)
            for event in captured:
                state = {"task-failed": "FAILURE", "task-retried": "RETRY"}.get(event["type"])
                if state and event["uuid"] in named:
                    ending = (state, event["exception"].split("(")[0])
                    found[named[event["uuid"]], event["uuid"]].append(ending)
            return dict(found)

        try:
            yield endings
        finally:
            receiver.should_stop = True


@contextmanager
def _in_process_signals(names: set[str]) -> Iterator[Callable[[], Endings]]:
    """The same, from Celery's signals, for the in-process worker (which sends no events)."""
    found: Endings = defaultdict(list)

    def failed(sender: Any = None, task_id: str = "", exception: Any = None, **_: Any) -> None:
        if getattr(sender, "name", None) in names:
            found[sender.name, task_id].append(("FAILURE", type(exception).__name__))

    def retried(sender: Any = None, request: Any = None, reason: Any = None, **_: Any) -> None:
        if getattr(sender, "name", None) in names:
            found[sender.name, request.id].append(("RETRY", type(reason).__name__))

    signals.task_failure.connect(failed, weak=False)
    signals.task_retry.connect(retried, weak=False)
    try:
        yield lambda: dict(found)
    finally:
        signals.task_failure.disconnect(failed)
        signals.task_retry.disconnect(retried)


def test_a_timed_out_async_step_ends_its_tasks_as_a_timed_out_sync_step_does(
    harness: Harness,
) -> None:
    names = {"timeout_sync.stall", "timeout_async.stall"}
    watch = _in_process_signals(names) if harness.in_process else _worker_events(harness, names)
    with watch as endings:
        runs = {
            saga: harness.start(saga, {"order": 81}) for saga in ("timeout_sync", "timeout_async")
        }
        done = {saga: run.wait(60) for saga, run in runs.items()}
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and len(endings()) < 4:
            time.sleep(0.2)
        seen = endings()
    for saga, run in runs.items():
        assert done[saga].state is ExecutionState.FAILED
        assert done[saga].rollback_status is RollbackStatus.COMPLETED
        assert done[saga].failure_reason == (
            f"StepTimeoutError: step 'stall' of saga {saga!r} timed out after 1s"
        )
        began = [r for r in harness.test_app.entries(run.id) if r.direction == "forward_begin"]
        assert len(began) == 2, began  # retry=2: two attempts, each timed out
    by_saga: dict[str, list[list[tuple[str, str]]]] = {saga: [] for saga in runs}
    for (name, _), ended in seen.items():
        by_saga[name.split(".")[0]].append(ended)
    # Two tasks per step, one per attempt, each a FAILURE with the exception type the run's
    # failure_reason names: no RETRY of one task id, no wrapper.
    expected = [[("FAILURE", "StepTimeoutError")], [("FAILURE", "StepTimeoutError")]]
    assert by_saga == {"timeout_sync": expected, "timeout_async": expected}, seen


def test_a_timeout_while_its_run_is_cancelled_ends_failure_on_a_threads_pool(
    sqlite_harness: Harness,
) -> None:
    """The threads pool cannot stop a body, so the cancel's revoke announces nothing: the
    body's own timeout, in the run being cancelled, still ends its task as a timed-out
    attempt's (FAILURE with ``StepTimeoutError``), not ignored and left STARTED."""
    harness = sqlite_harness
    with _in_process_signals({"timed.slow"}) as endings:
        run = harness.start("timed", {"order": 82, "plan": {"slow": {"sleep": 30, "tick": True}}})
        deadline = time.monotonic() + 30
        while not any(e.direction == "tick" for e in harness.test_app.entries(run.id)):
            assert time.monotonic() < deadline, "slow's body never ran"
            time.sleep(0.1)
        assert harness.engine.cancel(run.id, "fraud suspected") is CancelVerdict.CANCEL
        assert run.wait(60).state is ExecutionState.CANCELLED
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not endings():
            time.sleep(0.1)
        seen = endings()
    assert list(seen.values()) == [[("FAILURE", "StepTimeoutError")]], seen


def test_a_timeout_that_stops_a_body_inside_a_query_is_a_timeout(harness: Harness) -> None:
    """The soft limit landing inside a query leaves the body with the driver's rollback
    error (the stop in its context): the attempt still ends as timed out, its task a
    FAILURE with ``StepTimeoutError``, and the run's history says so."""
    if harness.name != "postgres-rabbitmq":
        pytest.skip("a prefork worker's soft limit inside PostgreSQL's pg_sleep")
    with _worker_events(harness, {"timed.slow"}) as endings:
        run = harness.start("timed", {"order": 83, "plan": {"slow": {"query_sleep": 30}}})
        deadline = time.monotonic() + 30
        while not (failed := _attempt_rows(harness, run.id)):
            assert time.monotonic() < deadline, "slow's first attempt never ended"
            time.sleep(0.2)
        while time.monotonic() < deadline and not endings():
            time.sleep(0.1)
        seen = endings()
        harness.engine.cancel(run.id, "done looking")
        run.wait(60)
    assert "StepTimeoutError" in str(failed[0].detail), failed[0]
    assert "timed out after 5s" in str(failed[0].detail), failed[0]
    assert next(iter(seen.values())) == [("FAILURE", "StepTimeoutError")], seen


def _attempt_rows(harness: Harness, execution_id: str) -> list[HistoryEntry]:
    rows = history.load(harness.engine.db, execution_id)
    return [e for e in rows if e.kind in ATTEMPT_KINDS and e.step == "slow" and e.attempt == 1]
