"""Many runs at once: a move made on every run a filter selects, on PostgreSQL with real
prefork workers. Each moved run's history names the operation once; a dry run changes
nothing; an operation whose CLI is killed mid-way and resumed, or whose store goes away
for a few seconds, acts on every run exactly once."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import func, select

from celery_saga import ExecutionState, Saga, SagaEngine, compensated_by
from celery_saga.cli import saga
from celery_saga.store.history import Kind
from celery_saga.store.tables import (
    bulk_operations,
    executions,
    history,
    run_labels,
    step_records,
)
from tests.conftest import ROOT, Harness, _test_database_url, in_process_pg_engine
from tests.faults import proxy

ON_POSTGRES = pytest.mark.parametrize("harness", ["postgres-rabbitmq"], indirect=True)


def _until(condition: Callable[[], bool], timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not reached in {timeout} s: {what}"
        time.sleep(0.1)


def _count(engine: SagaEngine, query: Any) -> int:
    return int(engine.db.read(query)[0]["n"])


def _in_state(engine: SagaEngine, ids: list[str], state: ExecutionState) -> int:
    query = select(func.count().label("n")).where(
        executions.c.id.in_(ids), executions.c.state == state.value
    )
    return _count(engine, query)


def _states(engine: SagaEngine, ids: list[str]) -> dict[str, int]:
    query = (
        select(executions.c.state, func.count().label("n"))
        .where(executions.c.id.in_(ids))
        .group_by(executions.c.state)
    )
    return {row["state"]: row["n"] for row in engine.db.read(query)}


def moved_rows(
    engine: SagaEngine, ids: list[str], kind: Kind = Kind.CANCELLED
) -> dict[str, list[str | None]]:
    """Each run's history rows of ``kind`` (a move's own), by their actor."""
    query = select(history.c.execution_id, history.c.actor).where(
        history.c.execution_id.in_(ids), history.c.kind == kind.value
    )
    found: dict[str, list[str | None]] = {run: [] for run in ids}
    for row in engine.db.read(query):
        found[row["execution_id"]].append(row["actor"])
    return found


def _waiting_batch(
    engine: SagaEngine, saga_name: str, count: int, batch: str, customer: Callable[[int], str]
) -> dict[str, list[str]]:
    """``count`` runs parked at their gate, labelled with the batch and a customer; their
    ids by customer."""
    by_customer: dict[str, list[str]] = {}
    for index in range(count):
        labels = {"batch": batch, "customer": customer(index)}
        run = engine.start(saga_name, {"order": index}, labels=labels).id
        by_customer.setdefault(labels["customer"], []).append(run)
    every = [run for runs in by_customer.values() for run in runs]
    _until(
        lambda: _in_state(engine, every, ExecutionState.WAITING) == count,
        what=f"{count} runs waiting at their gate",
    )
    return by_customer


def _invoke(harness: Harness, *args: str) -> Result:
    obj = SimpleNamespace(app=harness.test_app.app)
    return CliRunner().invoke(saga, list(args), obj=obj, catch_exceptions=False)


def _rows(engine: SagaEngine, ids: list[str]) -> list[Any]:
    """Every stored row of these runs, and every bulk operation: what a dry run must not
    change."""
    seen: list[Any] = []
    for table in (executions, step_records, history, run_labels):
        key = table.c.id if table is executions else table.c.execution_id
        rows = engine.db.read(select(table).where(key.in_(ids)).order_by(*table.primary_key))
        seen += [tuple(row.values()) for row in rows]
    seen.append(_count(engine, select(func.count().label("n")).select_from(bulk_operations)))
    return seen


@ON_POSTGRES
def test_bulk_cancel_by_label_cancels_those_runs_once_each_and_no_other(
    harness: Harness,
) -> None:
    engine, batch = harness.engine, uuid.uuid4().hex[:10]
    runs = _waiting_batch(engine, "gate_last", 300, batch, lambda i: "42" if i % 3 else "7")
    chosen, others = runs["42"], runs["7"]
    assert len(chosen) == 200
    progress: list[int] = []
    done = engine.bulk(
        "cancel",
        [f"label.batch={batch}", "label.customer=42"],
        actor="ops@example",
        reason="customer 42 closed their account",
        progress=lambda report: progress.append(report.acted),
    )
    assert (done.acted, done.refused, done.already, done.finished) == (200, 0, 0, True)
    assert progress[-1] == 200 and len(progress) >= 3  # at the start, and after each page
    _until(
        lambda: _in_state(engine, chosen, ExecutionState.CANCELLED) == 200,
        what="200 runs cancelled",
    )
    assert _in_state(engine, others, ExecutionState.WAITING) == 100
    rows = moved_rows(engine, chosen)
    assert all(actors == [f"ops@example (bulk {done.operation_id})"] for actors in rows.values())
    assert not any(moved_rows(engine, others).values())


@ON_POSTGRES
def test_a_dry_run_counts_and_shows_a_sample_and_changes_nothing(harness: Harness) -> None:
    engine, batch = harness.engine, uuid.uuid4().hex[:10]
    runs = _waiting_batch(engine, "gate_last", 30, batch, lambda i: "42" if i % 2 else "7")
    every = runs["42"] + runs["7"]
    before = _rows(engine, every)
    where = ["--where", f"label.batch={batch}", "--where", "label.customer=42"]
    shown = _invoke(harness, "cancel", *where, "--dry-run")
    assert shown.exit_code == 0, shown.output
    assert "15 run(s) match" in shown.output
    assert "dry run: nothing changed" in shown.output
    assert sum(run in shown.output for run in runs["42"]) == 10  # the sample
    assert not any(run in shown.output for run in runs["7"])
    unconfirmed = _invoke(harness, "cancel", *where)
    assert unconfirmed.exit_code == 1
    assert "run it again with --yes" in unconfirmed.output
    time.sleep(1.0)  # anything sent would have reached a worker by now
    assert _rows(engine, every) == before


def _cli(harness: Harness, *args: str) -> subprocess.Popen[str]:
    env = harness.process_env()
    command = [sys.executable, "-m", "celery", "-A", "tests.sagaapp:app", "saga", *args]
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _killed_and_resumed(
    harness: Harness, move: str, where: list[str], rows: Callable[[], dict[str, list[Any]]]
) -> str:
    """A bulk ``move`` by the CLI, SIGKILLed once 130 of the runs ``rows`` gives (their
    history rows of the move, by actor) were acted on (past the first page of 100, into the
    second, whose cursor is not stored yet), then carried on with ``--resume``: the resumed
    run tries none of them again. The mark of its actor in the runs' history."""
    first = _cli(harness, move, *where, "--yes", "--rate", "40/s")
    assert first.stdout is not None
    started = first.stdout.readline()
    found = re.search(r"--resume (bulk-\w+)", started)
    assert found, started + (first.stdout.read() if first.poll() is not None else "")
    operation = found.group(1)
    mark = f"(bulk {operation})"

    def acted() -> int:
        return sum(any(a and a.endswith(mark) for a in actors) for actors in rows().values())

    _until(lambda: acted() >= 130, what=f"130 runs acted on by the first bulk {move}")
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    before, chosen = acted(), len(rows())
    assert 130 <= before < chosen
    second = _cli(harness, move, "--resume", operation, "--yes")
    output, _ = second.communicate(timeout=120)
    assert second.returncode == 0, output
    summary = re.search(r"(\d+) acted on, (\d+) refused or unchanged, (\d+) already", output)
    assert summary, output
    total, refused, already = (int(n) for n in summary.groups())
    # The resumed run skipped what the killed one did since its last page: no move tried
    # twice (a second try would count as refused: the run has moved on already).
    assert refused == 0 and already >= before - 100 > 0, output
    assert total == chosen - already
    return mark


@ON_POSTGRES
def test_a_bulk_cancel_killed_mid_way_and_resumed_acts_on_every_run_once(
    harness: Harness,
) -> None:
    engine, batch = harness.engine, uuid.uuid4().hex[:10]
    runs = _waiting_batch(engine, "gate_last", 240, batch, lambda i: "42" if i % 6 else "7")
    chosen = runs["42"]
    where = ["--where", f"label.batch={batch}", "--where", "label.customer=42"]
    # The states a cancel leaves too (compensating while its unwind runs): the runs it
    # moved stay selected, and only the operation's own history rows keep it from trying
    # them again.
    for state in ("waiting", "cancelling", "compensating", "cancelled"):
        where += ["--where", f"state={state}"]
    mark = _killed_and_resumed(harness, "cancel", where, lambda: moved_rows(engine, chosen))
    rows = moved_rows(engine, chosen)
    assert all(len(actors) == 1 and actors[0].endswith(mark) for actors in rows.values())
    # A cancel whose unwind message the killed process never sent is left to the recovery
    # sweep (beat runs it; here it is run once, by hand).
    engine.recover(0)
    _until(
        lambda: _in_state(engine, chosen, ExecutionState.CANCELLED) == len(chosen),
        what=str(_states(engine, chosen)),
    )
    assert _in_state(engine, runs["7"], ExecutionState.WAITING) == len(runs["7"])


def _gate_saga(name: str) -> Saga:
    def undo(ctx: Any) -> None:
        return None

    @compensated_by(undo)
    def reserve(ctx: Any) -> str:
        return "reserved"

    return Saga(name).step("reserve", reserve).wait_for("go")


def test_a_store_outage_during_a_bulk_cancel_is_waited_out_and_no_run_is_acted_on_twice() -> None:
    name = f"outage{uuid.uuid4().hex[:6]}"
    direct = _test_database_url()
    port = int(re.search(r":(\d+)/", direct).group(1))  # type: ignore[union-attr]
    with proxy(port) as cut:
        through = direct.replace(f":{port}/", f":{cut.port}/")
        with in_process_pg_engine(
            "bulkoutage", _gate_saga(name), concurrency=2, store_url=through
        ) as engine:
            batch = uuid.uuid4().hex[:10]
            runs = _waiting_batch(engine, name, 120, batch, lambda i: "42")["42"]
            results: list[Any] = []
            worker = threading.Thread(
                target=lambda: results.append(
                    engine.bulk("cancel", [f"label.batch={batch}"], actor="ops", rate=40.0)
                )
            )
            worker.start()
            _until(lambda: bool(moved_rows(engine, runs)) and cut is not None, 10)
            time.sleep(1.0)
            cut.cut(4.0)
            began = time.monotonic()
            worker.join(120)
            assert time.monotonic() - began >= 3.0  # it waited the outage out
            assert results, "the bulk operation did not finish"
            done = results[0]
            assert done.finished and done.refused == 0
            assert done.acted + done.already == len(runs)
            rows = moved_rows(engine, runs)
            assert all(len(actors) == 1 for actors in rows.values()), rows
            _until(lambda: _in_state(engine, runs, ExecutionState.CANCELLED) == len(runs))
            assert cut.cuts, "the store was never cut"


def _parked_batch(harness: Harness, batch: str, count: int) -> tuple[list[str], str]:
    """``count`` runs of ``five`` parked at the reversal of s2 (a switch keeps it failing)."""
    switch = f"undo-{uuid.uuid4().hex}"
    harness.test_app.set_switch(switch, True)
    plan = {"s4": {"fail": True}, "s2": {"undo_switch": switch}}
    runs = [
        harness.engine.start("five", {"order": n, "plan": plan}, labels={"batch": batch}).id
        for n in range(count)
    ]
    _until(
        lambda: _in_state(harness.engine, runs, ExecutionState.COMPENSATION_STUCK) == count,
        what=f"{count} runs parked",
    )
    return runs, switch


def _resumed_rows(engine: SagaEngine, ids: list[str]) -> dict[str, int]:
    query = select(history.c.execution_id, func.count().label("n")).where(
        history.c.execution_id.in_(ids), history.c.kind == Kind.RESUMED.value
    )
    rows = engine.db.read(query.group_by(history.c.execution_id))
    return {run: next((r["n"] for r in rows if r["execution_id"] == run), 0) for run in ids}


@ON_POSTGRES
def test_a_carried_on_bulk_resume_never_resumes_a_run_that_parked_again(harness: Harness) -> None:
    """A resume can be made twice on a run that parks again; the operation's own history
    rows are what keep an operation carried on from its last stored cursor from doing so."""
    engine, batch = harness.engine, uuid.uuid4().hex[:10]
    runs, _switch = _parked_batch(harness, batch, 3)
    done = engine.bulk("resume", [f"label.batch={batch}"], actor="ops", rate=20.0)
    assert (done.acted, done.refused, done.finished) == (3, 0, True)
    # The reversal still fails: each run parks again, as it was before the operation.
    _until(lambda: _in_state(engine, runs, ExecutionState.COMPENSATION_STUCK) == 3)
    # As if its process had died after its moves and before it stored its cursor.
    from sqlalchemy import update

    with engine.db.transaction() as connection:
        connection.execute(
            update(bulk_operations)
            .where(bulk_operations.c.id == done.operation_id)
            .values(cursor=None, finished_at=None)
        )
    again = engine.bulk("resume", resume=done.operation_id)
    assert (again.already, again.refused, again.finished) == (3, 0, True)
    assert _resumed_rows(engine, runs) == {run: 1 for run in runs}
    with pytest.raises(Exception, match="there is nothing left to resume"):
        engine.bulk("resume", resume=done.operation_id)
    # Another operation is another operation: it resumes them again.
    other = engine.bulk("resume", [f"label.batch={batch}"], actor="ops")
    assert other.acted == 3
    assert _resumed_rows(engine, runs) == {run: 2 for run in runs}
    # Given up for good: abandon them all, as one more operation.
    _until(lambda: _in_state(engine, runs, ExecutionState.COMPENSATION_STUCK) == 3)
    gave_up = engine.bulk("abandon", [f"label.batch={batch}"], actor="ops", reason="by hand")
    assert (gave_up.acted, gave_up.refused) == (3, 0)
    assert _in_state(engine, runs, ExecutionState.FAILED) == 3


@ON_POSTGRES
def test_a_bulk_resolve_marks_each_parked_reversal_done_by_hand_once(harness: Harness) -> None:
    engine, batch = harness.engine, uuid.uuid4().hex[:10]
    runs, _switch = _parked_batch(harness, batch, 3)
    with pytest.raises(Exception, match="a bulk resolve needs step and note"):
        engine.bulk("resolve", [f"label.batch={batch}"])
    done = engine.bulk(
        "resolve", [f"label.batch={batch}"], actor="ops", step="s2", note="undone by hand"
    )
    assert (done.acted, done.refused) == (3, 0)
    _until(lambda: _in_state(engine, runs, ExecutionState.FAILED) == 3, what="3 runs unwound")
    resolved = engine.db.read(
        select(history.c.execution_id, history.c.actor).where(
            history.c.execution_id.in_(runs), history.c.kind == "resolved"
        )
    )
    assert sorted(r["execution_id"] for r in resolved) == sorted(runs)
    assert all(r["actor"] == f"ops (bulk {done.operation_id})" for r in resolved)
