"""A run's history: each transition writes its row with the transition, naming who acted
(issue 28, part 1), and `celery saga show` tells the story from it (part 2)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from types import SimpleNamespace
from typing import Any

from click.testing import CliRunner, Result

from celery_saga import ExecutionState, Saga, get_clock
from celery_saga.cli import saga
from celery_saga.store import history
from celery_saga.store.history import HistoryEntry
from tests.conftest import Harness


def _rows(engine: Any, execution_id: str, *kinds: str) -> list[HistoryEntry]:
    found = history.load(engine.db, execution_id)
    return [row for row in found if not kinds or row.kind in kinds]


def _invoke(harness: Harness, *args: str) -> Result:
    obj = SimpleNamespace(app=harness.test_app.app)
    return CliRunner().invoke(saga, list(args), obj=obj, catch_exceptions=False)


def _shown(harness: Harness, execution_id: str) -> dict[str, Any]:
    result = _invoke(harness, "show", execution_id, "--json")
    assert result.exit_code == 0, result.output
    shown: dict[str, Any] = json.loads(result.output)
    return shown


def test_a_run_records_its_start_first(harness: Harness) -> None:
    run = harness.start("five", {"order": 90})
    assert run.wait(30).state is ExecutionState.COMPLETED, harness.worker_logs()
    rows = _rows(harness.engine, run.id)
    assert [r.kind for r in rows][:1] == ["started"]
    assert [r.kind for r in rows].count("started") == 1
    assert rows[0].at == run.get().record.created_at


def test_park_resume_park_abandon_each_leave_a_row_and_every_reversal_attempt_counts(
    harness: Harness,
) -> None:
    switch = f"undo-{uuid.uuid4().hex}"
    harness.test_app.set_switch(switch, True)  # s2's reversal keeps failing
    run = harness.start(
        "five", {"order": 91, "plan": {"s4": {"fail": True}, "s2": {"undo_switch": switch}}}
    )
    assert run.wait(30).state is ExecutionState.COMPENSATION_STUCK, harness.worker_logs()
    harness.engine.resume_compensation(run.id, actor="alice@ops-1")
    assert run.wait(30).state is ExecutionState.COMPENSATION_STUCK, harness.worker_logs()
    skipped = harness.engine.abandon_compensation(
        run.id, actor="bob@ops-2", reason="refunded by hand"
    )
    assert skipped == 1

    rows = _rows(harness.engine, run.id, "parked", "resumed", "abandoned")
    assert [r.kind for r in rows] == ["parked", "resumed", "parked", "abandoned"]
    first, resumed, second, abandoned = rows
    for parked in (first, second):
        assert (parked.step, parked.attempt, parked.actor) == ("s2", 3, None)
        assert "cannot undo s2" in (parked.detail or "")
    assert (resumed.actor, resumed.step, resumed.attempt) == ("alice@ops-1", "s2", 3)
    assert resumed.data == {"s2": 3}
    assert (abandoned.actor, abandoned.detail) == ("bob@ops-2", "refunded by hand")
    assert abandoned.data == {"skipped": ["s1"]}

    tried = [e for e in harness.test_app.entries(run.id) if e.direction == "compensate_failed"]
    steps = {s["name"]: s for s in _shown(harness, run.id)["steps"]}
    reversal = steps["s2"]["compensation"]
    assert (reversal["attempts"], reversal["total_attempts"]) == (3, len(tried)) == (3, 6)
    text = _invoke(harness, "show", run.id).output
    assert "after 6 attempts (3 since the last resume)" in text, text
    assert "by alice@ops-1" in text and "by bob@ops-2" in text


def test_a_wait_records_its_event_and_the_signal_who_sent_it(harness: Harness) -> None:
    run = harness.start("gate_only")
    assert run.wait(30).state is ExecutionState.WAITING, harness.worker_logs()
    (entered,) = _rows(harness.engine, run.id, "wait-entered")
    assert entered.data == {"event": "go", "until": None}
    listed = _invoke(harness, "list", "--state", "waiting", "--limit", "1000").output
    line = next(line for line in listed.splitlines() if line.startswith(run.id))
    assert "waiting for signal 'go'" in line, listed
    shown = _shown(harness, run.id)
    assert shown["waiting_for_event"] == "go"
    assert "waiting for signal 'go' (no deadline)" in _invoke(harness, "show", run.id).output

    assert harness.engine.signal(run.id, "go", {"ok": True}, actor="carol@desk")
    assert run.wait(30).state is ExecutionState.COMPLETED, harness.worker_logs()
    (signalled,) = _rows(harness.engine, run.id, "signalled")
    assert signalled.actor == "carol@desk"
    assert signalled.data == {"event": "go", "resumed": True}
    (line,) = [e for e in _shown(harness, run.id)["timeline"] if e["kind"] == "signalled"]
    assert line["took"].startswith("waited ") and line["actor"] == "carol@desk"


def test_a_parent_at_its_sub_saga_says_in_list_and_show_that_it_waits_for_its_child(
    harness: Harness,
) -> None:
    from celery_saga.runtime.children import child_execution_id
    from celery_saga.store import queries

    parent = harness.start("gated_parent", {"order": 93})
    child_id = child_execution_id(parent.id, "gated_child")
    deadline = time.monotonic() + 30
    while (child := queries.load_execution(harness.engine.db, child_id)) is None or (
        child.state is not ExecutionState.WAITING
    ):
        assert time.monotonic() < deadline, harness.worker_logs()
        time.sleep(0.05)
    said = f"waiting for child run {child_id}"
    listed = _invoke(harness, "list", "--saga", "gated_parent", "--limit", "1000").output
    assert said in next(line for line in listed.splitlines() if line.startswith(parent.id))
    assert said in _invoke(harness, "show", parent.id).output
    assert harness.engine.signal(child_id, "go")
    assert parent.wait(30).state is ExecutionState.COMPLETED, harness.worker_logs()
    listed = _invoke(harness, "list", "--saga", "gated_parent", "--limit", "1000").output
    assert said not in listed, "a parent whose child ended waits for nothing"


def test_a_wait_that_times_out_records_entering_and_timing_out(harness: Harness) -> None:
    run = harness.start("approval", {"order": 92})
    assert run.wait(30).state is ExecutionState.WAITING, harness.worker_logs()
    (entered,) = _rows(harness.engine, run.id, "wait-entered")
    wake_at = run.get().record.wake_at
    assert entered.data == {"event": "approved", "until": wake_at.isoformat()}
    time.sleep(max(0.0, (wake_at - get_clock().now()).total_seconds()) + 0.05)
    assert harness.engine.fire_timers() >= 1
    run.wait(30, states=[ExecutionState.FAILED, ExecutionState.COMPENSATION_STUCK])
    (timed_out,) = _rows(harness.engine, run.id, "wait-timed-out")
    assert (timed_out.detail or "").startswith("WaitTimeoutError: saga 'approval' waited 2 s")
    kinds = [r.kind for r in _rows(harness.engine, run.id)]
    assert kinds.index("wait-entered") < kinds.index("wait-timed-out")
    shown = _shown(harness, run.id)
    (line,) = [e for e in shown["timeline"] if e["kind"] == "wait-timed-out"]
    assert line["took"].startswith("waited 2.")
    (gate,) = [n for n in shown["tree"] if n["kind"] == "wait"]
    assert gate["status"] == "timed out" and "'approved'" in gate["detail"]


def test_a_cancel_records_who_cancelled_and_why(harness: Harness) -> None:
    run = harness.start("gate_only")
    assert run.wait(30).state is ExecutionState.WAITING, harness.worker_logs()
    harness.engine.cancel(run.id, "not needed", actor="dave@desk")
    (cancelled,) = _rows(harness.engine, run.id, "cancelled")
    assert (cancelled.actor, cancelled.detail) == ("dave@desk", "CancelledError: not needed")


def test_the_cli_records_the_os_user_and_host_as_actor(harness: Harness) -> None:
    from celery_saga.cli.follow import shell_operator

    run = harness.start("gate_only")
    assert run.wait(30).state is ExecutionState.WAITING, harness.worker_logs()
    assert _invoke(harness, "signal", run.id, "go").exit_code == 0
    (signalled,) = _rows(harness.engine, run.id, "signalled")
    assert signalled.actor == shell_operator() and "@" in shell_operator()


def test_the_recovery_sweep_records_what_it_recovered(direct: Any) -> None:
    direct.register(Saga(f"lost{uuid.uuid4().hex[:6]}").step("a", lambda ctx: None))
    name = next(iter(direct.catalog.names()))
    run = direct.start(name, {})  # its first message sits in a queue nobody consumes
    assert direct.recover(stale_after=0) == 1
    (recovered,) = _rows(direct, run.id, "recovered")
    assert recovered.detail == "republish_position"
    assert [r.kind for r in _rows(direct, run.id)] == ["started", "recovered"]


def test_show_draws_the_graph_with_each_nodes_status(harness: Harness) -> None:
    runs = {
        "parent": harness.start("parent", {"order": 93}),
        "fanout": harness.start("fanout", {"order": 94}),
        "batch": harness.start("batch", {"items": ["x", "y", "z"]}),
        "routed": harness.start("routed", {"amounts": [1, 2]}),
    }
    for run in runs.values():
        assert run.wait(30).state is ExecutionState.COMPLETED, harness.worker_logs()
    parent = _shown(harness, runs["parent"].id)["tree"]
    assert [(n["kind"], n["status"]) for n in parent] == [
        ("step", "completed"),
        ("sub_saga", "completed"),
        ("step", "completed"),
    ]
    assert [c["name"] for c in parent[1]["children"]] == ["c1", "c2"]
    group = _shown(harness, runs["fanout"].id)["tree"][1]
    assert (group["kind"], group["status"], len(group["children"])) == ("parallel", "completed", 3)
    loop = _shown(harness, runs["batch"].id)["tree"][1]
    assert (loop["kind"], loop["detail"]) == ("for_each", "3 items run")
    branch = _shown(harness, runs["routed"].id)["tree"][1]
    assert branch["detail"] == "path 'small' taken, not big"
    assert [c["name"] for c in branch["children"]] == ["auto"]
    text = _invoke(harness, "show", runs["routed"].id).output
    assert "graph:\n" in text and "  branch size: completed  (path 'small' taken, not big)" in text


def test_show_follow_prints_what_happens_until_the_run_ends(harness: Harness) -> None:
    run = harness.start("gate_only")
    assert run.wait(30).state is ExecutionState.WAITING, harness.worker_logs()

    def later() -> None:
        time.sleep(1.0)
        harness.engine.signal(run.id, "go", actor="erin@desk")

    sender = threading.Thread(target=later)
    sender.start()
    started = time.monotonic()
    result = _invoke(harness, "show", run.id, "--follow", "--interval", "0.2")
    sender.join()
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started < 30
    _, after = result.output.split("wait-entered", 1)
    assert "signalled" in after and "by erin@desk" in after, result.output
    assert result.output.rstrip().endswith("ended: completed  rollback=-"), result.output
    followed = _invoke(harness, "show", run.id, "--follow", "--json").output.splitlines()
    assert json.loads(followed[-1]) == {"ended": "completed", "rollback_status": None}


def test_ctrl_c_ends_show_follow_quietly() -> None:
    from celery_saga.cli.follow import follow_until_ended

    def interrupted() -> Any:
        raise KeyboardInterrupt

    printed: list[str] = []
    waiting: Any = SimpleNamespace(
        state="waiting", rollback_status=None, timeline=SimpleNamespace(entries=())
    )
    follow_until_ended(interrupted, waiting, printed.append, as_json=False, interval=0)
    assert printed == [""], "no traceback, no end line: the operator stopped watching"
