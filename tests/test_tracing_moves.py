"""The spans of the moves on many runs or none, and of a queued run's start, in one
process (``task_always_eager``): a pause and an unpause are operator spans of their own,
each run an unpause releases gets an ``operator release`` span in its own trace, linked to
the unpause's; a bulk operation is one span, each run it moves gets its move's operator
span in its trace, linked to the operation's; a run queued by its flow-control limit and
started by the run that freed its slot is one trace of its own, its start a span in it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from celery import Celery
from opentelemetry import trace

from celery_saga import ExecutionState, Limit, Saga, SagaContext, SagaEngine
from tests.tracing_kit import check_one_trace, finished_spans, of_run


def _engine(tmp_path: Path) -> SagaEngine:
    app = Celery("traced_moves", set_as_current=False)
    app.conf.update(task_always_eager=True, task_eager_propagates=True, broker_url="memory://")
    engine = SagaEngine(app, store_url=f"sqlite:///{tmp_path}/moves.sqlite3")

    def work(ctx: SagaContext) -> str:
        return ctx.step_name

    engine.register(
        Saga("shipping").step("pack", work).step("ship", work),
        Saga("gated").step("a", work, compensate=lambda ctx: None).wait_for("go").step("b", work),
        Saga("solo", concurrency=Limit(max=1)).step("a", work).wait_for("go").step("b", work),
    )
    return engine


def _one(spans: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [s for s in spans if s["name"] == name]
    assert len(found) == 1, f"{len(found)} spans named {name!r}"
    return found[0]


def test_a_pause_and_each_release_of_its_unpause_are_spans(tmp_path: Path, spans: Any) -> None:
    engine = _engine(tmp_path)
    engine.pause("shipping", "ship", reason="carrier down", actor="ops")
    runs = [engine.start("shipping", {}) for _ in range(3)]
    assert {r.get().state for r in runs} == {ExecutionState.HELD}
    with trace.get_tracer("test").start_as_current_span("POST /unpause") as request:
        lifted = engine.unpause("shipping", "ship", actor="ops", reason="carrier back")
    assert lifted.released == 3
    assert {r.get().state for r in runs} == {ExecutionState.COMPLETED}
    exported = finished_spans(spans)
    pause = _one(exported, "operator pause")
    assert pause["attributes"] == {
        "saga.action": "pause",
        "saga.actor": "ops",
        "saga.name": "shipping",
        "saga.step": "ship",
    }
    unpause = _one(exported, "operator unpause")
    assert unpause["trace"] == format(request.get_span_context().trace_id, "032x")
    assert unpause["attributes"]["saga.released"] == 3
    for run in runs:
        mine = of_run(exported, run.id)
        trace_id = check_one_trace(mine)
        assert trace_id != unpause["trace"]
        release = _one(mine, "operator release")
        assert release["attributes"]["saga.actor"] == "ops"
        assert [link["id"] for link in release["links"]] == [unpause["id"]]
        # the released step's attempt is in the run's trace (the message carried it)
        assert [s["name"] for s in mine].count("step ship") == 1


def test_a_bulk_operation_is_one_span_each_runs_move_linked_to_it(
    tmp_path: Path, spans: Any
) -> None:
    engine = _engine(tmp_path)
    runs = [engine.start("gated", {}, labels={"batch": "b1"}) for _ in range(3)]
    other = engine.start("gated", {}, labels={"batch": "b2"})
    done = engine.bulk("cancel", ["label.batch=b1"], actor="ops", reason="recall")
    assert (done.acted, done.refused) == (3, 0)
    assert other.get().state is ExecutionState.WAITING
    exported = finished_spans(spans)
    operation = _one(exported, "operator bulk")
    assert operation["attributes"]["saga.bulk_id"] == done.operation_id
    assert operation["attributes"]["saga.move"] == "cancel"
    assert operation["attributes"]["saga.actor"] == "ops"
    for run in runs:
        assert run.get().state is ExecutionState.CANCELLED
        mine = of_run(exported, run.id)
        assert check_one_trace(mine) != operation["trace"]
        cancel = _one(mine, "operator cancel")
        assert [link["id"] for link in cancel["links"]] == [operation["id"]]
        assert any(s["name"] == "reversal a" for s in mine)
    assert not [s for s in of_run(exported, other.id) if s["name"].startswith("operator")]


def test_a_queued_run_started_by_the_run_that_freed_its_slot_is_its_own_trace(
    tmp_path: Path, spans: Any
) -> None:
    engine = _engine(tmp_path)
    first = engine.start("solo", {})
    assert first.get().state is ExecutionState.WAITING
    with trace.get_tracer("test").start_as_current_span("POST /solo") as request:
        queued = engine.start("solo", {})
    assert queued.get().state is ExecutionState.QUEUED
    engine.signal(first.id, "go", {})
    assert first.get().state is ExecutionState.COMPLETED
    assert queued.get().state is ExecutionState.WAITING
    exported = finished_spans(spans)
    caller = _one(exported, "POST /solo")
    mine = of_run(exported, queued.id)
    trace_id = check_one_trace(mine, caller)
    assert trace_id == format(request.get_span_context().trace_id, "032x")
    root = next(s for s in mine if s["name"] == "saga solo")
    assert root["attributes"]["saga.queued"] is True
    start = _one(mine, "start solo")
    assert start["attributes"]["saga.admitted_by"] == first.id
    assert start["parent"] == root["id"]
    # linked to the span of the freeing run current as it gave its slot back
    freeing = {s["id"] for s in of_run(exported, first.id)}
    assert start["links"] and {link["id"] for link in start["links"]} <= freeing
    assert _one(mine, "step a")["trace"] == trace_id
    # nothing of the queued run strayed into the trace of the run that freed its slot
    assert check_one_trace(of_run(exported, first.id)) != trace_id
