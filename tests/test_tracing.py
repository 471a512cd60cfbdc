"""One OpenTelemetry trace per run, in one process (``task_always_eager``): the root span
``saga <name>`` under the caller's span, a span per attempt and per reversal (each
reversal linked to the forward attempt it undoes), waits, sub-sagas and operator moves
in the same trace; nothing at all with tracing off; no plaintext of a marked field in
any span; the trace ids on log records and in ``saga show``. Across real worker
processes: tests/test_tracing_workers.py."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from opentelemetry import trace

from celery_saga import ExecutionState, Saga, SagaContext, SagaEngine
from celery_saga.inspect.text import run_lines
from celery_saga.store import queries
from celery_saga.tracing import TraceIdsFilter
from tests.tracing_kit import check_one_trace, finished_spans, of_run, sdk_provider

CARD = "4111-1111-1111-1111"


def _engine(tmp_path: Path, **settings: Any) -> SagaEngine:
    app = Celery("traced", set_as_current=False)
    app.conf.update(
        task_always_eager=True, task_eager_propagates=True, broker_url="memory://", **settings
    )
    engine = SagaEngine(app, store_url=f"sqlite:///{tmp_path}/store.sqlite3")
    calls: dict[str, int] = {}

    def work(ctx: SagaContext) -> Any:
        calls[ctx.step_name] = calls.get(ctx.step_name, 0) + 1
        plan = ctx.input.get("plan", {}).get(ctx.step_name, {})
        if plan.get("fail_attempts", 0) >= ctx.attempt or plan.get("fail"):
            raise ValueError(f"{ctx.step_name} refused card {ctx.input.get('card')}")
        return {"step": ctx.step_name}

    def undo(ctx: SagaContext) -> None:
        calls[f"undo {ctx.step_name}"] = calls.get(f"undo {ctx.step_name}", 0) + 1

    engine.register(
        Saga("kid").step("k1", work, compensate=undo),
        Saga("order", sensitive=["card"])
        .step("a", work, compensate=undo)
        .sub_saga("kid")
        .step("b", work, compensate=undo, retry=2, backoff=0.01)
        .step("c", work),
        Saga("gated").step("a", work, compensate=undo).wait_for("go").step("b", work),
    )
    return engine


def test_a_run_is_one_trace_under_the_span_that_started_it(tmp_path: Path, spans: Any) -> None:
    engine = _engine(tmp_path)
    plan = {"b": {"fail_attempts": 1}, "c": {"fail": True}}
    with trace.get_tracer("test").start_as_current_span("POST /orders") as request:
        run = engine.start("order", {"card": CARD, "plan": plan})
    assert run.get().state is ExecutionState.FAILED
    exported = finished_spans(spans)
    caller = next(s for s in exported if s["name"] == "POST /orders")
    assert caller["id"] == format(request.get_span_context().span_id, "016x")
    mine = [s for s in exported if s is not caller]
    trace_id = check_one_trace(mine, caller)
    assert trace_id == caller["trace"]
    root = next(s for s in mine if s["name"] == "saga order")
    assert root["parent"] == caller["id"]
    names = sorted(s["name"] for s in of_run(mine, run.id) if s is not root)
    # b failed once and was retried: a span per attempt; c failed for good: the unwind
    # reverses b, the sub-saga (in the child's run: its reversal of k1) and a.
    assert names == ["reversal a", "reversal b", "step a", "step b", "step b", "step c"]
    b_attempts = sorted(
        (s["attributes"]["saga.attempt"], s["attributes"]["saga.outcome"])
        for s in mine
        if s["name"] == "step b"
    )
    assert b_attempts == [(1, "retrying"), (2, "ran")]
    failed = [s for s in mine if s["attributes"].get("saga.outcome") == "failed"]
    assert [s["name"] for s in failed] == ["step c"]
    assert [e["name"] for e in failed[0]["events"]] == ["exception"]
    assert failed[0]["status"] == "ERROR"
    # The sub-saga's run is a child span of the parent's trace, under its step.
    kid_root = next(s for s in mine if s["name"] == "saga kid")
    kid = of_run(mine, kid_root["attributes"]["saga.execution_id"])
    assert sorted(s["name"] for s in kid) == ["reversal k1", "saga kid", "step k1"]
    parent_span = next(s for s in mine if s["id"] == kid_root["parent"])
    assert parent_span["attributes"]["saga.execution_id"] == run.id
    stored = queries.load_execution(engine.db, run.id)
    assert stored is not None and stored.trace_context is not None
    assert stored.trace_context.split("-")[1] == trace_id
    assert f"trace {trace_id}" in run_lines(engine.inspect().run(run.id))


def test_no_plaintext_of_a_marked_field_in_any_span(tmp_path: Path, spans: Any) -> None:
    engine = _engine(tmp_path)
    run = engine.start("order", {"card": CARD, "plan": {"c": {"fail": True}}})
    assert run.get().state is ExecutionState.FAILED
    exported = json.dumps(finished_spans(spans))
    assert "refused card" in exported  # the failure is there, its card is not
    assert CARD not in exported


def test_a_wait_and_the_moves_on_a_run_are_in_its_trace(tmp_path: Path, spans: Any) -> None:
    engine = _engine(tmp_path)
    run = engine.start("gated", {})
    assert run.get().state is ExecutionState.WAITING
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("webhook") as sender:
        engine.signal(run.id, "go", {}, actor="hook")
    assert run.get().state is ExecutionState.COMPLETED
    exported = finished_spans(spans)
    mine = of_run(exported, run.id)
    trace_id = check_one_trace(mine)
    wait = next(s for s in mine if s["name"] == "wait go")
    assert wait["attributes"]["saga.wait_ending"] == "signal"
    sent_by = format(sender.get_span_context().span_id, "016x")
    assert sent_by in [link["id"] for link in wait["links"]]
    move = next(s for s in mine if s["name"] == "operator signal")
    assert move["attributes"]["saga.actor"] == "hook"
    after = next(s for s in mine if s["name"] == "step b")
    assert after["trace"] == trace_id


def test_a_cancel_is_a_span_of_the_run_with_its_actor(tmp_path: Path, spans: Any) -> None:
    engine = _engine(tmp_path)
    run = engine.start("gated", {})
    engine.cancel(run.id, actor="alice")
    assert run.get().state is ExecutionState.CANCELLED
    mine = of_run(finished_spans(spans), run.id)
    check_one_trace(mine)
    cancel = next(s for s in mine if s["name"] == "operator cancel")
    assert cancel["attributes"]["saga.actor"] == "alice"
    assert any(s["name"] == "reversal a" for s in mine)


@pytest.mark.parametrize("setting", [False, None])
def test_off_no_span_and_nothing_stored(tmp_path: Path, setting: bool | None) -> None:
    """``saga_tracing = False`` with a provider set; left unset without one (the API's
    own no-op provider): not a span, no trace stored."""
    if setting is None:
        engine = _engine(tmp_path)
        run = engine.start("order", {"card": CARD})
        exported: list[dict[str, Any]] = []
    else:
        with sdk_provider() as memory:
            engine = _engine(tmp_path, saga_tracing=setting)
            run = engine.start("order", {"card": CARD})
            exported = finished_spans(memory)
    assert run.get().state is ExecutionState.COMPLETED
    assert exported == []
    stored = queries.load_execution(engine.db, run.id)
    assert stored is not None and stored.trace_context is None


def test_a_bad_setting_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="saga_tracing must be True, False or None"):
        _engine(tmp_path, saga_tracing="yes")


def test_log_lines_about_an_attempt_carry_its_trace(
    tmp_path: Path, spans: Any, caplog: pytest.LogCaptureFixture
) -> None:
    engine = _engine(tmp_path)
    caplog.handler.addFilter(TraceIdsFilter())
    with caplog.at_level(logging.WARNING, logger="celery_saga"):
        run = engine.start("order", {"card": CARD, "plan": {"c": {"fail": True}}})
    failed = next(s for s in finished_spans(spans) if s["name"] == "step c")
    line = next(r for r in caplog.records if "step 'c' attempt 1 failed" in r.getMessage())
    assert (line.otel_trace_id, line.otel_span_id) == (failed["trace"], failed["id"])
    assert run.get().state is ExecutionState.FAILED


def test_a_failed_attempt_leaves_nothing_behind_with_tracing_on() -> None:
    """The failure-memory guarantees (tests/test_failure_memory.py) with every attempt in
    a span: the span records the error's text, never holds the error."""
    from tests import test_failure_memory as memory

    with sdk_provider() as exported:
        memory.test_a_failed_steps_exception_is_freed_without_a_garbage_collection()
        memory.test_a_failed_compensations_exception_is_freed_without_a_garbage_collection()
        memory.test_a_step_that_retried_itself_leaves_its_frames_to_be_freed_at_once()
        names = {s.name for s in exported.get_finished_spans()}
    assert {"step charge", "reversal charge"} & names, names


def test_a_line_outside_any_span_carries_the_trace_of_the_run_being_handled() -> None:
    """A sweep's line about a run (no span current, the run's trace carried) names the
    run's trace and root span; a line about nothing names none."""
    from celery_saga.tracing.carry import carrying

    root = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    def ids() -> tuple[str, str]:
        record = logging.LogRecord("celery_saga", logging.INFO, __file__, 1, "x", None, None)
        TraceIdsFilter().filter(record)
        return record.otel_trace_id, record.otel_span_id

    with carrying(root):
        assert ids() == ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
    assert ids() == ("0", "0")


def test_a_deadline_cancel_is_a_span_of_the_run(tmp_path: Path, spans: Any) -> None:
    engine = _engine(tmp_path)
    run = engine.start("gated", {}, timeout=0.05)
    time.sleep(0.1)
    assert engine.executor.cancel_overdue() == 1
    assert run.get().state is ExecutionState.CANCELLED
    mine = of_run(finished_spans(spans), run.id)
    check_one_trace(mine)
    cancel = next(s for s in mine if s["name"] == "operator cancel")
    assert "saga.actor" not in cancel["attributes"]
    assert any(s["name"] == "reversal a" for s in mine)


def test_the_moves_on_a_held_run_are_spans_of_its_trace_with_their_actor(
    tmp_path: Path, spans: Any
) -> None:
    app = Celery("traced_hold", set_as_current=False)
    app.conf.update(task_always_eager=True, task_eager_propagates=False, broker_url="memory://")
    engine = SagaEngine(app, store_url=f"sqlite:///{tmp_path}/held.sqlite3")
    provider = {"down": True}

    def charge(ctx: SagaContext) -> str:
        if provider["down"]:
            raise ConnectionError("provider down")
        return "charged"

    engine.register(Saga("held_trace").step("charge", charge, on_failure="hold"))
    run = engine.start("held_trace", {})
    assert run.get().state is ExecutionState.HELD
    provider["down"] = False
    engine.retry(run.id, actor="ops", reason="provider back")
    assert run.get().state is ExecutionState.COMPLETED
    mine = of_run(finished_spans(spans), run.id)
    check_one_trace(mine)
    retry = next(s for s in mine if s["name"] == "operator retry")
    assert retry["attributes"]["saga.actor"] == "ops"
    assert [s["name"] for s in mine].count("step charge") == 2


def test_span_times_come_from_the_packages_clock(tmp_path: Path, spans: Any) -> None:
    """A span's start and end are read from the clock the package reads every time from
    (``set_clock``), so a test on a controlled clock sees its spans at the clock's times."""
    from datetime import datetime, timezone

    from celery_saga import set_clock
    from celery_saga.testing import ControlledClock

    at = datetime(2031, 3, 1, 9, 0, tzinfo=timezone.utc)
    clock = ControlledClock(at)
    previous = set_clock(clock)
    try:
        engine = _engine(tmp_path)
        run = engine.start("gated", {})
        clock.advance(3600)
        engine.signal(run.id, "go", {}, actor="hook")
    finally:
        set_clock(previous)
    assert run.get().state is ExecutionState.COMPLETED
    mine = of_run(finished_spans(spans), run.id)
    at_ns = int(at.timestamp()) * 1_000_000_000
    hour = 3600 * 1_000_000_000
    times = {s["name"]: (s["start"] - at_ns, s["end"] - at_ns) for s in mine}
    assert times["saga gated"] == (0, 0)
    assert times["step a"] == (0, 0)
    assert times["wait go"] == (0, hour)
    assert times["operator signal"] == (hour, hour)
    assert times["step b"] == (hour, hour)
