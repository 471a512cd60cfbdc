"""Guarantee 33 for the transitions made on no step's or reversal's account, and for the
operator of ``recover`` and ``archive``: each writes its history row in the transaction that
makes it, saying why (and who, for an operator)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import insert, select, update

from celery_saga import (
    ExecutionState,
    RollbackStatus,
    Saga,
    SagaEngine,
    path,
    set_clock,
    step,
)
from celery_saga.cli import saga as saga_cli
from celery_saga.cli.follow import shell_operator
from celery_saga.decisions.admission import NodeMessage
from celery_saga.runtime.children import child_execution_id
from celery_saga.store import history
from celery_saga.store.codec import pack
from celery_saga.store.database import to_db_time
from celery_saga.store.history import HistoryEntry
from celery_saga.store.tables import executions, history_archive, signals
from celery_saga.testing import ControlledClock
from celery_saga.worker.embedded import embedded_worker
from tests.conftest import unconsumed_app


def _noop() -> None:
    return None


def _refuse() -> None:
    raise ValueError("the warehouse refused")


def _rows(engine: SagaEngine, execution_id: str, archived: bool = False) -> list[HistoryEntry]:
    return history.load(engine.db, execution_id, archived=archived)


def _kinds(engine: SagaEngine, execution_id: str) -> list[str]:
    return [row.kind for row in _rows(engine, execution_id)]


def _only(engine: SagaEngine, execution_id: str, kind: str) -> HistoryEntry:
    (row,) = [row for row in _rows(engine, execution_id) if row.kind == kind]
    return row


def _drive(engine: SagaEngine, run_id: str, saga: str) -> None:
    """Deliver the run's current position until it stops moving (one worker, in order)."""
    for _ in range(20):
        record = engine.get(run_id).record
        if record.state is not ExecutionState.RUNNING:
            return
        before = (record.cursor, record.cursor_sub, record.version)
        engine.executor.run_node(NodeMessage(run_id, record.cursor, record.cursor_sub, 0, 1), saga)
        after = engine.get(run_id).record
        if (after.cursor, after.cursor_sub, after.version) == before:
            return
    raise AssertionError("the run did not settle")


def _set_run(engine: SagaEngine, execution_id: str, **values: Any) -> None:
    with engine.db.transaction() as connection:
        connection.execute(update(executions).where(executions.c.id == execution_id).values(values))


def _invoke(engine: SagaEngine, *args: str) -> Result:
    obj = SimpleNamespace(app=engine.app)
    return CliRunner().invoke(saga_cli, list(args), obj=obj, catch_exceptions=False)


def _shown(engine: SagaEngine, execution_id: str) -> dict[str, Any]:
    result = _invoke(engine, "show", execution_id, "--json")
    assert result.exit_code == 0, result.output
    shown: dict[str, Any] = json.loads(result.output)
    return shown


@pytest.fixture
def live(store_url: str) -> Iterator[SagaEngine]:
    """An engine on each backend with an in-process worker consuming its own queue."""
    app = unconsumed_app("history")
    app.conf.broker_transport_options = {"polling_interval": 0.01}
    engine = SagaEngine(app, store_url=store_url)
    engine.ensure_schema()
    with embedded_worker(app, concurrency=2):
        yield engine
    engine.db.dispose()


@pytest.fixture
def clock() -> Iterator[ControlledClock]:
    controlled = ControlledClock(datetime(2033, 3, 1, 9, 0, tzinfo=timezone.utc))
    previous = set_clock(controlled)
    yield controlled
    set_clock(previous)


@pytest.mark.parametrize(
    "build",
    [
        lambda s, kid: s.branch("size", lambda ctx: "huge", path("small", step("x", _noop))),
        lambda s, kid: s.for_each(lambda ctx: 1 / 0, step("x", _noop)),
        lambda s, kid: s.do_until(lambda ctx: 1 / 0, step("x", _noop)),
        lambda s, kid: s.sub_saga(kid, input=lambda ctx: {"at": {1, 2}}),
    ],
    ids=[
        "branch-unknown-path",
        "for-each-items-raise",
        "loop-condition-raises",
        "child-input-cannot-be-stored",
    ],
)
def test_a_run_failed_outside_any_step_records_why_before_its_unwind(
    direct: SagaEngine, build: Any
) -> None:
    name = f"astray{uuid.uuid4().hex[:6]}"
    direct.register(Saga(f"{name}kid").step("k", _noop))
    direct.register(build(Saga(name).step("first", _noop, compensate=_noop), f"{name}kid"))
    run = direct.start(name)
    _drive(direct, run.id, name)
    record = direct.get(run.id).record
    assert record.state is ExecutionState.COMPENSATING, "failed, and its unwind begun"
    failed = _only(direct, run.id, "run-failed")
    assert failed.detail == record.failure_reason and failed.actor is None
    kinds = _kinds(direct, run.id)
    assert kinds[-2:] == ["step-completed", "run-failed"], kinds


def test_a_run_that_ends_at_a_node_where_nothing_runs_records_its_completion(
    direct: SagaEngine,
) -> None:
    name = f"empty{uuid.uuid4().hex[:6]}"
    direct.register(Saga(name).step("a", _noop).for_each(lambda ctx: [], step("x", _noop)))
    run = direct.start(name)
    _drive(direct, run.id, name)
    assert direct.get(run.id).state is ExecutionState.COMPLETED
    assert _kinds(direct, run.id) == ["started", "step-completed", "run-completed"]
    completed = _only(direct, run.id, "run-completed")
    assert completed.detail == "its last node ran nothing (a loop that ended, no item left)"


def test_a_run_whose_last_gate_finds_its_signal_records_its_completion(
    direct: SagaEngine,
) -> None:
    name = f"early{uuid.uuid4().hex[:6]}"
    direct.register(Saga(name).step("a", _noop).wait_for("go"))
    run = direct.start(name)
    assert not direct.signal(run.id, "go", actor="gina@desk"), "stored before the run waits"
    _drive(direct, run.id, name)
    assert direct.get(run.id).state is ExecutionState.COMPLETED
    kinds = _kinds(direct, run.id)
    assert kinds == ["started", "signalled", "step-completed", "run-completed"], kinds
    completed = _only(direct, run.id, "run-completed")
    assert completed.detail == "'go': its signal was stored when the run reached its last gate"


def test_a_child_reopened_by_its_parents_unwind_records_its_unwind_begun(
    live: SagaEngine,
) -> None:
    child, parent = f"child{uuid.uuid4().hex[:6]}", f"parent{uuid.uuid4().hex[:6]}"
    live.register(Saga(child).step("c1", _noop, compensate=_noop))
    live.register(
        Saga(parent).step("p1", _noop, compensate=_noop).sub_saga(child).step("p2", _refuse)
    )
    run = live.start(parent)
    execution = run.wait(30)
    assert execution.rollback_status is RollbackStatus.COMPLETED
    child_id = child_execution_id(run.id, child)
    assert _kinds(live, child_id) == [
        "started",
        "step-completed",
        "unwind-begun",
        "reversal-completed",
    ]
    begun = _only(live, child_id, "unwind-begun")
    assert (begun.detail or "").startswith(
        f"its parent saga {parent!r} ({run.id}) is unwinding: ValueError: the warehouse refused"
    )


@pytest.mark.parametrize("reversible", [True, False], ids=["owes-a-reversal", "owes-none"])
def test_a_failed_run_taken_up_by_the_sweep_records_its_unwind_begun(
    direct: SagaEngine, reversible: bool
) -> None:
    name = f"orphan{uuid.uuid4().hex[:6]}"
    direct.register(Saga(name).step("a", _noop, compensate=_noop if reversible else None))
    run = direct.start(name)
    _drive(direct, run.id, name)
    # recorded failed, its unwind never begun (a worker of an earlier release died there)
    _set_run(direct, run.id, state="failed", failure_reason="lost", rollback_status=None)
    assert direct.recover(stale_after=0) >= 1
    kinds = _kinds(direct, run.id)
    begun = _only(direct, run.id, "unwind-begun")
    assert begun.detail == "recorded failed before its unwind started"
    if reversible:
        assert kinds[-2:] == ["recovered", "unwind-begun"], kinds
        assert direct.get(run.id).state is ExecutionState.COMPENSATING
        return
    assert kinds[-3:] == ["recovered", "unwind-begun", "unwind-closed"], kinds
    closed = _only(direct, run.id, "unwind-closed")
    assert closed.detail == "nothing left to reverse: rollback not_applicable"
    assert direct.get(run.id).state is ExecutionState.FAILED


def test_an_unwind_closed_by_a_re_plan_records_it(direct: SagaEngine) -> None:
    name = f"replan{uuid.uuid4().hex[:6]}"
    direct.register(Saga(name).step("a", _noop).step("b", _refuse))
    run = direct.start(name)
    _drive(direct, run.id, name)
    # compensating with nothing left to reverse: its closing write was lost
    _set_run(direct, run.id, state="compensating", rollback_status=None)
    assert direct.recover(stale_after=0) >= 1
    assert _kinds(direct, run.id)[-2:] == ["recovered", "unwind-closed"]
    closed = _only(direct, run.id, "unwind-closed")
    assert closed.detail == "nothing left to reverse: rollback not_applicable"
    record = direct.get(run.id).record
    assert (record.state, record.rollback_status) == (
        ExecutionState.FAILED,
        RollbackStatus.NOT_APPLICABLE,
    )


def test_a_cancelled_runs_unwind_begun_names_the_steps_it_cut_short(direct: SagaEngine) -> None:
    name = f"cut{uuid.uuid4().hex[:6]}"
    direct.register(
        Saga(name).step("a", _noop, compensate=_noop).step("b", _refuse, retry=2, backoff=60)
    )
    run = direct.start(name)
    _drive(direct, run.id, name)
    assert direct.get(run.id).step("b").status.value == "pending", "waits for its retry"
    direct.cancel(run.id, "not needed", actor="dave@desk")
    assert direct.get(run.id).state is ExecutionState.COMPENSATING
    kinds = _kinds(direct, run.id)
    assert kinds[-2:] == ["cancelled", "unwind-begun"], kinds
    begun = _only(direct, run.id, "unwind-begun")
    assert begun.detail == "CancelledError: not needed; cut short, recorded failed: b"
    assert begun.data == {"cut_short": ["b"]}


def test_a_cancel_with_nothing_to_reverse_records_its_unwind_closed(direct: SagaEngine) -> None:
    name = f"idle{uuid.uuid4().hex[:6]}"
    direct.register(Saga(name).step("a", _noop).wait_for("go"))
    run = direct.start(name)
    _drive(direct, run.id, name)
    direct.cancel(run.id, actor="dave@desk")
    assert direct.get(run.id).state is ExecutionState.CANCELLED
    assert _kinds(direct, run.id)[-3:] == ["cancelled", "unwind-begun", "unwind-closed"]


def test_a_late_group_join_records_the_join(direct: SagaEngine) -> None:
    # The counts missed a member (a worker of an earlier release settled it without
    # counting): the join is made when a settled member's message comes again.
    name = f"late{uuid.uuid4().hex[:6]}"
    members = [step(f"m{index}", _noop) for index in range(3)]
    direct.register(Saga(name).parallel("group", *members).step("after", _noop))
    run = direct.start(name)
    for member in (0, 1):
        direct.executor.run_node(NodeMessage(run.id, 0, 0, member, 1), name)
    _set_run(direct, run.id, members_settled=executions.c.members_settled - 1)
    direct.executor.run_node(NodeMessage(run.id, 0, 0, 2, 1), name)
    assert direct.get(run.id).record.cursor == 0, "the last member found the group short"
    direct.executor.run_node(NodeMessage(run.id, 0, 0, 0, 1), name)
    assert direct.get(run.id).record.cursor == 1
    assert _kinds(direct, run.id)[-1] == "group-joined"
    joined = _only(direct, run.id, "group-joined")
    assert (joined.step, joined.detail) == (
        "group",
        "every member (m0, m1, m2) had settled but the group was not joined; joined when "
        "the message of 'm0' came again: the run moves on",
    )


def test_a_timer_resume_that_found_its_signal_records_it(
    direct: SagaEngine, clock: ControlledClock
) -> None:
    name = f"found{uuid.uuid4().hex[:6]}"
    direct.register(Saga(name).wait_for("go", timeout=60).step("after", _noop))
    run = direct.start(name)
    _drive(direct, run.id, name)
    assert direct.get(run.id).state is ExecutionState.WAITING
    # a signal stored without resuming the run (the store's word against a lost write)
    with direct.db.transaction() as connection:
        stamp = to_db_time(clock.now())
        row = {"execution_id": run.id, "event": "go", "payload": pack(None)}
        connection.execute(insert(signals).values(**row, received_at=stamp))
    clock.advance(61)
    direct.fire_timers()
    assert direct.get(run.id).state is ExecutionState.RUNNING
    assert _kinds(direct, run.id) == ["started", "wait-entered", "wait-resumed"]
    resumed = _only(direct, run.id, "wait-resumed")
    assert resumed.detail == "'go': its signal was stored already; the timer sweep moved the run on"
    assert resumed.data == {"event": "go"}
    timeline = [e for e in _shown(direct, run.id)["timeline"] if e["kind"] == "wait-resumed"]
    assert timeline[0]["took"] == "waited 61.0 s"


def test_recover_names_who_ran_it_from_the_api_and_the_cli(direct: SagaEngine) -> None:
    name = f"lost{uuid.uuid4().hex[:6]}"
    direct.register(Saga(name).step("a", _noop))
    first, second = direct.start(name), direct.start(name)  # messages nobody consumes
    assert direct.recover(stale_after=0, actor="erin@ops") >= 2
    assert _only(direct, first.id, "recovered").actor == "erin@ops"
    assert _invoke(direct, "recover", "--stale-after", "0s").exit_code == 0
    recovered = [r for r in _rows(direct, second.id) if r.kind == "recovered"]
    assert [r.actor for r in recovered] == ["erin@ops", shell_operator()]


def test_archiving_writes_an_archived_row_into_the_archive_with_the_run(
    direct: SagaEngine, clock: ControlledClock
) -> None:
    name = f"old{uuid.uuid4().hex[:6]}"
    direct.register(Saga(name).step("a", _noop))
    first, second = direct.start(name), direct.start(name)
    for run in (first, second):
        _drive(direct, run.id, name)
    clock.advance(3600)
    assert direct.archive(60, actor="frank@ops") >= 1
    assert _rows(direct, first.id) == [], "the live history went with the run"
    archived = _rows(direct, first.id, archived=True)
    assert [r.kind for r in archived] == ["started", "step-completed", "archived"]
    assert archived[-1].actor == "frank@ops"
    assert archived[-1].detail == "ended, and not updated since 2033-03-01T09:59:00+00:00"
    with direct.db.transaction() as connection:
        stamp = connection.execute(
            select(history_archive.c.at).where(
                history_archive.c.execution_id == first.id, history_archive.c.kind == "archived"
            )
        ).scalar_one()
    assert stamp == to_db_time(clock.now())


def test_saga_cleanup_archive_names_its_operator_and_show_prints_the_row(
    direct: SagaEngine, clock: ControlledClock
) -> None:
    name = f"old{uuid.uuid4().hex[:6]}"
    direct.register(Saga(name).step("a", _noop))
    run = direct.start(name)
    _drive(direct, run.id, name)
    clock.advance(3600)
    assert _invoke(direct, "cleanup", "--older-than", "1m", "--archive").exit_code == 0
    (archived,) = [r for r in _rows(direct, run.id, archived=True) if r.kind == "archived"]
    assert archived.actor == shell_operator()
    text = _invoke(direct, "show", run.id).output
    line = next(line for line in text.splitlines() if "archived " in line and " ms " in line)
    assert f"by {shell_operator()}" in line, text
