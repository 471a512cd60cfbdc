"""Guarantee 22 with real ``celery worker`` processes on RabbitMQ and PostgreSQL: a rolling
deploy of a changed saga fails and unwinds nothing, every run finishes on the version it
started with, a worker without a run's version hands its messages back until a worker that
has it takes the run, and an operator moves a parked run to a new version only when the
nodes it passed are unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from celery_saga import (
    CompensationOutcome,
    ExecutionState,
    InvalidStateError,
    RollbackStatus,
    SagaError,
    UpgradeRefusedError,
)
from celery_saga.cli import saga as saga_cli
from celery_saga.cli.follow import shell_operator
from celery_saga.decisions.cancel import CancelVerdict
from celery_saga.store import history
from tests.conftest import BROKERS, PORTS, _test_database_url, require_services
from tests.deploy_rig import DeployRig
from tests.test_crash_recovery import wait_for
from tests.versioned_app import DEPLOY_STEPS


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[DeployRig]:
    require_services(PORTS["postgres"], PORTS["postgres-rabbitmq"])
    rig = DeployRig(BROKERS["postgres-rabbitmq"], _test_database_url(), tmp_path)
    try:
        yield rig
    finally:
        rig.close()


def _version(rig: DeployRig, versions: str) -> str:
    return rig.clients[versions].definition("deploy").hash


def _check_runs(rig: DeployRig, ended: dict[str, Any], failing: set[str]) -> None:
    v1, v2 = _version(rig, "1"), rig.client.definition("deploy").hash
    tags = {v1: "1", v2: "2"}
    for execution_id, execution in ended.items():
        tag = tags[execution.record.definition_hash]
        names = {s.name for s in execution.steps}
        if execution_id in failing:
            assert execution.state is ExecutionState.FAILED
            assert execution.rollback_status is RollbackStatus.COMPLETED
            assert "declined" in (execution.failure_reason or ""), execution.failure_reason
            assert names == DEPLOY_STEPS[tag] - {"ship"}, (tag, names)
        else:
            assert execution.state is ExecutionState.COMPLETED, execution.failure_reason
            assert names == DEPLOY_STEPS[tag], (tag, names)
        assert rig.ledger_code(execution_id, "reserve") == [tag], "its own version's body"
    twice = {key: n for key, n in rig.ledger_keys().items() if n > 1}
    assert not twice, f"effects applied twice: {twice}"


def test_a_rolling_deploy_fails_nothing_and_each_run_finishes_on_its_own_version(
    rig: DeployRig,
) -> None:
    rig.start_worker("old", "1")
    v1_runs = rig.start("1", 12) + rig.start("1", 4, fail=True, pace=0.3)
    failing = set(v1_runs[12:])
    rig.start_worker("new", "1,2")
    v2_runs = rig.start("1,2", 8) + rig.start("1,2", 4, fail=True, pace=0.3)
    failing |= set(v2_runs[8:])
    stopped: list[bool] = []

    def stop_the_old_worker_midway() -> None:
        moved = sum(1 for i in v1_runs + v2_runs if rig.client.get(i).steps)
        if not stopped and moved >= 20:
            rig.stop_worker("old")
            stopped.append(True)

    ended = rig.drive(v1_runs + v2_runs, timeout=240, during=stop_the_old_worker_midway)
    assert stopped, "the old worker was stopped while runs were in flight"
    assert {ended[i].record.definition_hash for i in v1_runs} == {_version(rig, "1")}
    assert {ended[i].record.definition_hash for i in v2_runs} == {
        rig.client.definition("deploy").hash
    }, "new runs start on the newest version"
    _check_runs(rig, ended, failing)
    assert "handed back" in rig.log("old"), "the old worker met v2 messages and handed them back"
    assert "DefinitionChangedError" not in rig.log("old") + rig.log("new")


def _versions_json(rig: DeployRig) -> list[dict[str, Any]]:
    import json

    result = CliRunner().invoke(
        saga_cli, ["versions", "--json"], obj=type("Ctx", (), {"app": rig.client.app})()
    )
    assert result.exit_code == 0, result.output
    return list(json.loads(result.output)["items"])


def test_a_worker_without_the_version_leaves_runs_waiting_until_one_with_it_starts(
    rig: DeployRig,
) -> None:
    rig.start_worker("newest", "2")
    waiting = rig.start("1", 6)
    v1 = _version(rig, "1")
    wait_for(lambda: all(rig.client.get(i).waiting_for_version == v1 for i in waiting), timeout=30)
    assert all(not rig.client.get(i).steps for i in waiting), "nothing ran on another version"
    items = {(i["saga"], i["hash"]): i for i in _versions_json(rig)}
    assert items[("deploy", v1)]["live_runs"] == 6
    v2 = rig.client.definition("deploy").hash
    assert any(name.startswith("newest-") for name in items[("deploy", v2)]["seen_by"])
    assert rig.log("newest").count("handed back") >= 6
    listed = CliRunner().invoke(
        saga_cli,
        ["list", "--version", "1", "--json"],
        obj=type("Ctx", (), {"app": rig.client.app})(),
    )
    assert listed.exit_code == 0, listed.output
    assert '"waiting_for_version": "' + v1 in listed.output

    rig.start_worker("late", "1")
    ended = rig.drive(waiting, timeout=120)
    _check_runs(rig, ended, set())
    assert all(rig.client.get(i).waiting_for_version is None for i in waiting)
    assert {i["hash"]: i["live_runs"] for i in _versions_json(rig) if i["saga"] == "deploy"}[
        v1
    ] == 0, "no live run is left on the old version: its code can go"


def test_upgrade_moves_a_parked_run_whose_passed_nodes_are_unchanged_and_refuses_otherwise(
    rig: DeployRig,
) -> None:
    rig.start_worker("both", "1,2")
    old = rig.clients["1"]
    movable = old.start("approve", {}).id
    fixed = old.start("deploy", {}).id
    parked = (ExecutionState.WAITING,)
    wait_for(lambda: rig.client.get(movable).state in parked, timeout=30)
    wait_for(lambda: rig.client.get(fixed).state in parked, timeout=30)

    before = rig.client.get(fixed).record
    with pytest.raises(UpgradeRefusedError, match="node 'reserve' differs"):
        rig.client.upgrade(fixed, "2")
    assert rig.client.get(fixed).record == before, "nothing stored on refusal"
    ctx = type("Ctx", (), {"app": rig.client.app})()
    refused = CliRunner().invoke(saga_cli, ["upgrade", fixed, "--to", "2"], obj=ctx)
    assert refused.exit_code == 1
    assert refused.output.count("\n") == 1 and "'reserve'" in refused.output

    before = rig.client.get(movable).record
    dry = CliRunner().invoke(saga_cli, ["upgrade", movable, "--dry-run"], obj=ctx)
    assert dry.exit_code == 0, dry.output
    assert "allowed" in dry.output and "runs next, on that version: " in dry.output
    assert "notify" in dry.output, "the nodes it would run next there"
    assert rig.client.get(movable).record == before, "a dry run stores nothing"
    refused = CliRunner().invoke(saga_cli, ["upgrade", fixed, "--to", "2", "--dry-run"], obj=ctx)
    assert refused.exit_code == 1 and "'reserve'" in refused.output
    moved = CliRunner().invoke(saga_cli, ["upgrade", movable], obj=ctx)
    assert moved.exit_code == 0, moved.output
    (upgraded,) = [r for r in history.load(rig.client.db, movable) if r.kind == "upgraded"]
    assert upgraded.actor == shell_operator(), "the operator at the shell is recorded"
    rig.client.signal(movable, "ok")
    deadline = time.monotonic() + 60
    while rig.client.get(movable).state is not ExecutionState.COMPLETED:
        assert time.monotonic() < deadline, rig.client.get(movable)
        time.sleep(0.2)
    names = [s.name for s in rig.client.get(movable).steps]
    assert names == ["hold", "done", "notify"], "it finished on version 2"


def test_a_process_without_the_version_hands_signals_and_cancels_on_to_a_worker_with_it(
    rig: DeployRig,
) -> None:
    old, newest = rig.clients["1"], rig.clients["2"]
    rig.start_worker("old", "1")
    signalled, cancelled = old.start("approve", {}).id, old.start("approve", {}).id
    for execution_id in (signalled, cancelled):
        wait_for(lambda i=execution_id: rig.client.get(i).state is ExecutionState.WAITING, 30)
    rig.stop_worker("old")
    rig.start_worker("newest", "2")

    before = rig.client.get(signalled).record
    with pytest.raises(SagaError, match="payload of signal 'ok'"):
        newest.signal(signalled, "ok", object())  # bad input: an error here, nothing sent
    handed = newest.signal(signalled, "ok", {"by": "web"}, actor="web:maria")
    assert handed is False, "handed on, not resumed here"
    assert newest.cancel(cancelled, actor="web:tom") is CancelVerdict.CANCEL, "stored here"
    assert rig.client.get(cancelled).state is ExecutionState.CANCELLING
    wait_for(lambda: rig.log("newest").count("celery_saga.command") >= 2, timeout=30)
    assert rig.client.get(signalled).record.state is before.state, "no v2 worker moved it"
    # The hand-back marks the run from a thread of its own, a moment after its log line.
    marked = lambda: rig.client.get(signalled).waiting_for_version  # noqa: E731
    wait_for(lambda: marked() is not None, timeout=10)
    assert marked() == before.definition_hash

    rig.start_worker("late", "1")
    wait_for(lambda: rig.client.get(signalled).state is ExecutionState.COMPLETED, timeout=60)
    wait_for(lambda: rig.client.get(cancelled).state is ExecutionState.CANCELLED, timeout=60)
    assert [s.name for s in rig.client.get(signalled).steps] == ["hold", "done"], "on v1"
    held = rig.client.get(cancelled).steps[0]
    assert held.name == "hold" and held.compensation_status is not None
    assert "refused" not in rig.log("late"), rig.log("late")
    actors = {(r.kind, r.actor) for r in history.load(rig.client.db, signalled)}
    assert ("signalled", "web:maria") in actors, "the actor travels with the handed-on call"
    actors = {(r.kind, r.actor) for r in history.load(rig.client.db, cancelled)}
    assert ("cancelled", "web:tom") in actors


def test_a_process_without_the_version_hands_a_resolve_on_to_a_worker_with_it(
    rig: DeployRig,
) -> None:
    old, newest = rig.clients["1"], rig.clients["2"]
    rig.start_worker("old", "1")
    run = old.start("approve", {"stuck_at": "hold"}).id
    wait_for(lambda: rig.client.get(run).state is ExecutionState.WAITING, 30)
    old.cancel(run)  # its unwind parks at the reversal of hold
    wait_for(lambda: rig.client.get(run).state is ExecutionState.COMPENSATION_STUCK, 60)
    before = rig.client.get(run).record
    with pytest.raises(InvalidStateError, match="reversal of step 'hold', not 'done'"):
        newest.resolve(run, step="done", note="by hand")  # refused here, nothing sent
    assert rig.client.get(run).record == before
    newest.resolve(run, step="hold", note="by hand", actor="web:ann")
    wait_for(lambda: rig.client.get(run).state is ExecutionState.CANCELLED, 60)
    execution = rig.client.get(run)
    assert execution.rollback_status is RollbackStatus.COMPLETED
    assert execution.step("hold").compensation_status is CompensationOutcome.RESOLVED
    rows = [(r.kind, r.actor) for r in history.load(rig.client.db, run) if r.kind == "resolved"]
    assert rows == [("resolved", "web:ann")], "the actor travels with the handed-on call"
    assert "celery_saga.command" in rig.log("old")


def test_a_child_settling_on_a_worker_without_its_parents_version_hands_the_parent_on(
    rig: DeployRig,
) -> None:
    rig.start_worker("old", "1")
    rig.start_worker("newest", "2")  # shares every child's version, not the parents'
    failing = rig.start("1", 8, fail=True)
    ended = rig.drive(failing, timeout=150)
    _check_runs(rig, ended, set(failing))
    assert "pay.card.compensate" in rig.log("newest"), "a child's reversal ran on the v2 worker"
