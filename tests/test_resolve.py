"""Resolve: a parked reversal recorded as done by hand, and the ordered unwind goes on
(issue 42). Real workers: prefork processes on PostgreSQL with RabbitMQ and Redis, the
embedded worker on SQLite."""

from __future__ import annotations

import html
import re
import threading
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from celery_saga import CompensationOutcome, ExecutionState, InvalidStateError, RollbackStatus
from celery_saga.cli import saga as saga_cli
from celery_saga.contrib.django.story import graph_html, timeline_html
from celery_saga.errors import SagaError
from celery_saga.web import Credentials, WebSettings, create_app
from tests.conftest import Harness

AUTH = ("ops", "pw")
NOTE = "refunded 12.50 by hand in the provider's console"


def _parked_at_c(harness: Harness) -> Any:
    """A four_back run whose unwind (d, c, b, a) parked at c's reversal."""
    switch = f"undo-{uuid.uuid4().hex}"
    harness.test_app.set_switch(switch, True)
    plan = {"e": {"fail": True}, "c": {"undo_switch": switch}}
    run = harness.start("four_back", {"order": 42, "plan": plan})
    execution = run.wait(30)
    assert execution.state is ExecutionState.COMPENSATION_STUCK, harness.worker_logs()
    assert execution.step("c").compensation_status is CompensationOutcome.FAILED
    return run


def _reversals(harness: Harness, execution_id: str) -> list[str]:
    return [e.step for e in harness.test_app.entries(execution_id) if e.direction == "compensate"]


def _cli(harness: Harness, *args: str) -> Any:
    obj = SimpleNamespace(app=harness.test_app.app)
    return CliRunner().invoke(saga_cli, list(args), obj=obj)


def test_resolve_in_the_middle_of_an_unwind_runs_the_rest_in_order_once_each(
    harness: Harness,
) -> None:
    run = _parked_at_c(harness)
    assert _reversals(harness, run.id) == ["d"]
    harness.engine.resolve(run.id, step="c", note=NOTE, actor="alice@ops")
    execution = run.wait(30)
    assert execution.state is ExecutionState.FAILED, harness.worker_logs()
    assert execution.rollback_status is RollbackStatus.COMPLETED
    assert _reversals(harness, run.id) == ["d", "b", "a"], "the rest, in order, once each"
    failed = [e for e in harness.test_app.entries(run.id) if e.direction == "compensate_failed"]
    assert len(failed) == 1, "c's handler never ran again: it was done by hand"
    c = execution.step("c")
    assert c.compensation_status is CompensationOutcome.RESOLVED
    assert c.compensation_reason == f"done by hand by alice@ops: {NOTE}"
    rows = [row for row in harness.engine.inspect().run(run.id).history if row.kind == "resolved"]
    assert [(r.step, r.actor, r.detail) for r in rows] == [("c", "alice@ops", NOTE)]


def test_the_resolved_reversal_shows_done_by_hand_with_note_and_actor_in_every_view(
    harness: Harness,
) -> None:
    run = _parked_at_c(harness)
    result = _cli(harness, "resolve", run.id, "--step", "c", "--note", NOTE)
    assert result.exit_code == 0, result.output
    assert "resolved the reversal of c" in result.output
    run.wait(30)
    view = harness.engine.inspect().run(run.id)
    c = next(node for node in view.graph if node.name == "c")
    assert c.status == "completed -> compensation_resolved"
    assert "done by hand by " in (c.detail or "") and NOTE in (c.detail or "")
    shown = _cli(harness, "show", run.id)
    assert shown.exit_code == 0, shown.output
    assert "c: completed -> compensation_resolved" in shown.output
    assert f"its reversal done by hand; note: {NOTE}" in shown.output
    actor = next(row.actor for row in view.history if row.kind == "resolved")
    assert actor and actor in shown.output  # who did it: the shell's user@host
    client = create_app(harness.engine, WebSettings(Credentials(*AUTH))).test_client()
    page = client.get(f"/runs/{run.id}", auth=AUTH).get_data(as_text=True)
    assert 'data-status="completed -&gt; compensation_resolved"' in page
    assert "done by hand" in page and actor in page
    admin = graph_html(view.graph) + timeline_html(view)
    assert "compensation_resolved" in admin and "done by hand" in admin and actor in admin


def test_refusals_name_the_problem_and_store_nothing(harness: Harness) -> None:
    run = _parked_at_c(harness)
    version = run.get().record.version
    with pytest.raises(InvalidStateError, match="parked at the reversal of step 'c', not 'b'"):
        harness.engine.resolve(run.id, step="b", note=NOTE)
    with pytest.raises(SagaError, match="needs a note"):
        harness.engine.resolve(run.id, step="c", note="  ")
    assert run.get().record.version == version
    done = harness.start("four_back", {"order": 43})
    finished = done.wait(30)
    with pytest.raises(InvalidStateError, match="to be compensation_stuck; it is completed"):
        harness.engine.resolve(done.id, step="c", note=NOTE)
    assert done.get().record.version == finished.record.version


def test_a_resolve_retried_after_its_reply_was_lost_is_stored_once_and_the_unwind_goes_on(
    harness: Harness,
) -> None:
    """What a retry through a store outage does: the same call again. The run is no longer
    parked, but this very resolve is stored, so it answers as done and writes nothing."""
    run = _parked_at_c(harness)
    harness.engine.resolve(run.id, step="c", note=NOTE, actor="kim")
    harness.engine.resolve(run.id, step="c", note=NOTE, actor="kim")
    execution = run.wait(30)
    assert execution.state is ExecutionState.FAILED, harness.worker_logs()
    assert _reversals(harness, run.id) == ["d", "b", "a"], "each once"
    rows = [r for r in harness.engine.inspect().run(run.id).history if r.kind == "resolved"]
    assert [(r.actor, r.detail) for r in rows] == [("kim", NOTE)]
    with pytest.raises(InvalidStateError, match="it is failed"):
        harness.engine.resolve(run.id, step="c", note="another note", actor="kim")


def test_the_first_operator_wins_resolve_against_abandon_and_another_resolve(
    harness: Harness,
) -> None:
    run = _parked_at_c(harness)
    harness.engine.resolve(run.id, step="c", note=NOTE, actor="first")
    for late in (
        lambda: harness.engine.resolve(run.id, step="c", note="again", actor="second"),
        lambda: harness.engine.abandon_compensation(run.id, actor="second"),
        lambda: harness.engine.resume_compensation(run.id, actor="second"),
    ):
        with pytest.raises(InvalidStateError):
            late()
    execution = run.wait(30)
    assert execution.state is ExecutionState.FAILED
    rows = [r for r in harness.engine.inspect().run(run.id).history if r.kind == "resolved"]
    assert [r.actor for r in rows] == ["first"]
    assert _reversals(harness, run.id) == ["d", "b", "a"]


def test_the_web_views_resolve_shows_its_plan_then_acts_as_the_user(harness: Harness) -> None:
    run = _parked_at_c(harness)
    settings = WebSettings(Credentials(*AUTH), actions=True)
    client = create_app(harness.engine, settings).test_client()
    page = client.get(f"/runs/{run.id}", auth=AUTH).get_data(as_text=True)
    shown = html.unescape(page.split('id="plan-resolve">', 1)[1].split("</pre>", 1)[0])
    assert shown.splitlines()[1:5] == [
        "step: c (its reversal recorded as done by hand)",
        "settled: d (compensated)",
        "settled: c (compensation_resolved)",
        "reversals, in order: 2",
    ]
    form = page.split('action="/runs/' + run.id + '/resolve"', 1)[1].split("</form>", 1)[0]
    token = re.search(r'name="csrf_token" value="([^"]+)"', form)
    assert token is not None and 'name="step" value="c"' in form
    data = {"csrf_token": token[1], "step": "c", "note": NOTE}
    answer = client.post(f"/runs/{run.id}/resolve", data=data, auth=AUTH)
    assert answer.status_code == 303, answer.get_data(as_text=True)
    execution = run.wait(30)
    assert execution.state is ExecutionState.FAILED, harness.worker_logs()
    assert _reversals(harness, run.id) == ["d", "b", "a"]
    rows = [r for r in harness.engine.inspect().run(run.id).history if r.kind == "resolved"]
    assert [(r.actor, r.detail) for r in rows] == [(f"web:{AUTH[0]}", NOTE)]


def test_resolve_resume_and_abandon_racing_on_one_run_one_wins_and_nothing_runs_twice(
    harness: Harness,
) -> None:
    """Three operators at once, each with its own connection: the run's compare-and-set
    lets exactly one move it; the others are refused and store nothing."""
    run = _parked_at_c(harness)
    engine = harness.engine
    moves = {
        "resolve": lambda: engine.resolve(run.id, step="c", note=NOTE, actor="one"),
        "resume": lambda: engine.resume_compensation(run.id, actor="two"),
        "abandon": lambda: engine.abandon_compensation(run.id, actor="three"),
    }
    start = threading.Barrier(len(moves))
    won: list[str] = []
    refused: list[str] = []

    def race(name: str) -> None:
        start.wait()
        try:
            moves[name]()
        except InvalidStateError:
            refused.append(name)
        else:
            won.append(name)

    threads = [threading.Thread(target=race, args=(name,)) for name in moves]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(won) == 1 and len(refused) == 2, (won, refused)
    execution = run.wait(30)
    kinds = [r.kind for r in harness.engine.inspect().run(run.id).history]
    assert [k for k in kinds if k in ("resolved", "resumed", "abandoned")] == [
        {"resolve": "resolved", "resume": "resumed", "abandon": "abandoned"}[won[0]]
    ]
    reversed_ = _reversals(harness, run.id)
    assert len(reversed_) == len(set(reversed_)), "no reversal ran twice"
    assert execution.state in (ExecutionState.FAILED, ExecutionState.COMPENSATION_STUCK)
