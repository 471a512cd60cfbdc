"""Where ``saga_runs_started`` counts a run: the event that says a worker took its first
node, once per run (the first attempt's claim is taken once), whatever that node is."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from celery_saga import ExecutionState, Saga, SagaEngine, path, step
from celery_saga.decisions.openings import Opening, opening, opens_run
from celery_saga.metrics import enable_metrics
from celery_saga.worker.embedded import embedded_worker
from tests.conftest import unconsumed_app


def _fwd(ctx: Any) -> None:
    return None


def _of(saga: Saga) -> Opening:
    return opening(saga.seal().nodes)


def _started(step_name: str, attempt: int = 1) -> tuple[str, dict[str, Any]]:
    return "saga-step-started", {"saga": "s", "step": step_name, "attempt": attempt}


def test_only_the_first_attempt_of_the_first_step_opens_a_run() -> None:
    first = _of(Saga("s").step("a", _fwd).step("b", _fwd))
    assert opens_run([first], *_started("a"))
    assert not opens_run([first], *_started("a", attempt=2))  # a retry or a takeover
    assert not opens_run([first], *_started("b"))
    assert not opens_run([first], "saga-started", {"saga": "s"})  # the producer's event


def test_a_first_group_opens_with_its_first_member_alone() -> None:
    group = _of(Saga("s").parallel("g", step("m1", _fwd), step("m2", _fwd)))
    assert opens_run([group], *_started("m1"))
    assert not opens_run([group], *_started("m2"))


def test_a_first_branch_opens_with_the_first_step_of_whichever_path_it_takes() -> None:
    branch = _of(
        Saga("s").branch(
            "size",
            lambda ctx: "big",
            path("big", step("review", _fwd), step("approve", _fwd)),
            path("small", step("auto", _fwd)),
        )
    )
    assert branch.records == {"review", "auto"}


def test_first_loops_open_with_their_first_iteration() -> None:
    each = _of(Saga("s").for_each(lambda ctx: [1, 2], step("pack", _fwd)))
    until = _of(Saga("s").do_until(lambda ctx: True, step("poll", _fwd), max_iterations=3))
    assert (each.records, until.records) == ({"pack:0"}, {"poll:0"})
    assert not opens_run([each], *_started("pack:1"))


def test_a_pivot_first_is_passed_over_and_a_gate_first_opens_when_the_run_parks_there() -> None:
    assert _of(Saga("s").pivot().step("a", _fwd)).records == {"a"}
    gate = _of(Saga("s").wait_for("approved").step("a", _fwd))
    assert opens_run([gate], "saga-waiting", {"saga": "s", "event": "approved"})
    assert not opens_run([gate], *_started("a"))


def test_every_known_version_of_a_saga_is_asked() -> None:
    old, new = _of(Saga("s").step("a", _fwd)), _of(Saga("s").step("z", _fwd).step("a", _fwd))
    assert opens_run([old, new], *_started("z")) and opens_run([old, new], *_started("a"))


def test_a_step_that_opens_one_version_does_not_count_the_others_runs_again() -> None:
    old = opening(Saga("s").step("a", _fwd).seal().nodes, "old")
    new = opening(Saga("s").step("z", _fwd).step("a", _fwd).seal().nodes, "new")
    event, fields = _started("a")
    assert opens_run([old, new], event, {**fields, "version": "old"})
    assert not opens_run([old, new], event, {**fields, "version": "new"})  # counted at z


def test_a_first_sub_saga_opens_when_the_parent_claims_its_record() -> None:
    parent = _of(Saga("s").sub_saga("leaf", name="child").step("a", _fwd))
    assert opens_run([parent], *_started("child"))
    assert not opens_run([parent], *_started("a"))


def test_a_first_gate_whose_signal_came_first_opens_on_arrival_alone() -> None:
    gate = _of(Saga("s").wait_for("approved").step("a", _fwd))
    on_arrival = {"saga": "s", "event": "approved", "on_arrival": True}
    assert opens_run([gate], "saga-resumed", on_arrival)
    # a run parked at the gate, resumed by its signal: counted when it parked
    assert not opens_run([gate], "saga-resumed", {"saga": "s", "event": "approved"})


def test_a_first_loop_that_runs_nothing_opens_where_it_is_passed_at_position_0() -> None:
    each = _of(Saga("s").for_each(lambda ctx: [], step("pack", _fwd)).step("a", _fwd))
    until = _of(Saga("s").pivot().do_while(lambda ctx: False, step("poll", _fwd)))
    passed = {"saga": "s", "node": 0, "sub": 0}
    assert opens_run([each], "saga-node-passed", passed)
    assert opens_run([until], "saga-node-passed", {**passed, "node": 1})  # after the pivot
    # the loop ended after iterations (position past 0), or another node was passed
    assert not opens_run([each], "saga-node-passed", {**passed, "sub": 2})
    assert not opens_run([each], "saga-node-passed", {**passed, "node": 1})
    assert not opens_run([_of(Saga("s").step("a", _fwd))], "saga-node-passed", passed)


def test_a_failure_no_step_raised_opens_only_at_the_first_position() -> None:
    each = _of(Saga("s").for_each(lambda ctx: [], step("pack", _fwd)).step("a", _fwd))
    failed = {"saga": "s", "reason": "items", "node": 0, "sub": 0}
    assert opens_run([each], "saga-forward-failed", failed)
    assert not opens_run([each], "saga-forward-failed", {**failed, "sub": 3})
    assert not opens_run([each], "saga-forward-failed", {**failed, "node": 1})
    # a step that failed for good: its run was counted when the step started
    assert not opens_run([each], "saga-forward-failed", {"saga": "s", "reason": "boom"})


def test_an_event_that_names_its_version_is_matched_against_that_version_alone() -> None:
    pivot_first = opening(
        Saga("s").pivot().for_each(lambda ctx: [], step("p", _fwd)).seal().nodes, "A"
    )
    step_first = opening(
        Saga("s").step("a", _fwd).for_each(lambda ctx: [], step("p", _fwd)).seal().nodes, "B"
    )
    passed = {"saga": "s", "node": 1, "sub": 0}
    assert opens_run([pivot_first, step_first], "saga-node-passed", {**passed, "version": "A"})
    # B's runs opened at their first step: passing their empty for_each is not an opening
    assert not opens_run([pivot_first, step_first], "saga-node-passed", {**passed, "version": "B"})


def _leaf(ctx: Any) -> None:
    time.sleep(0.05)


def _no_items(ctx: Any) -> Any:
    raise LookupError("no order lines")


def _bad_input(ctx: Any) -> Any:
    raise KeyError("customer")


def test_every_opening_is_counted_once_per_real_run(tmp_path: Path) -> None:
    """On the embedded default: runs whose first node is a sub-saga, an empty ``for_each``,
    a ``do_while`` whose condition is false, a gate whose signal came before the run
    reached it (stored while no worker consumed the queue), or a first node that failed
    before anything ran (a ``for_each``'s items, a sub-saga's input) each count once,
    children too; a sub-saga node's span is not timed as a step."""
    app = unconsumed_app("openings")
    engine = SagaEngine(app, store_url=f"sqlite:///{tmp_path}/openings.sqlite3")
    registry = CollectorRegistry()
    enable_metrics(engine, registry=registry)
    engine.register(Saga("leaf").step("x", _leaf))
    engine.register(Saga("nested").sub_saga("leaf", name="child").step("a", _fwd))
    engine.register(Saga("nothing").for_each(lambda ctx: [], step("pack", _fwd)).step("a", _fwd))
    engine.register(Saga("never").do_while(lambda ctx: False, step("poll", _fwd)).step("a", _fwd))
    engine.register(Saga("gated").wait_for("go").step("a", _fwd))
    engine.register(Saga("unlisted").for_each(_no_items, step("pack", _fwd)))
    engine.register(Saga("orphan").sub_saga("leaf", input=_bad_input).step("a", _fwd))
    engine.ensure_schema()
    names = ("nested", "nothing", "never", "unlisted", "orphan")
    runs = [engine.start(name, {}) for name in names for _ in range(2)]
    gated = [engine.start("gated", {}) for _ in range(2)]
    for run in gated:
        engine.signal(run.id, "go")  # before any worker took the run
    with embedded_worker(app):
        settled = {run.id: run.wait(timeout=30).state for run in [*runs, *gated]}
    engine.db.dispose()
    assert list(settled.values()).count(ExecutionState.FAILED) == 4, settled
    found = {
        (sample.name, sample.labels.get("saga"), sample.labels.get("step")): sample.value
        for family in registry.collect()
        for sample in family.samples
    }
    counted = {saga: n for (name, saga, _), n in found.items() if name == "saga_runs_started_total"}
    assert counted == {name: 2 for name in (*names, "gated", "leaf")}, counted
    timed = {step for (name, _, step) in found if name == "saga_step_duration_seconds_count"}
    assert "x" in timed and "child" not in timed, timed
