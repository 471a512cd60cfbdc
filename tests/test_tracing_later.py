"""A run's trace across an hour, across processes and across a failover, over real
prefork workers (the rig of tests/test_tracing_workers.py).

On RabbitMQ and Redis: the unwind parks, the clock of every process moves an hour
(``traced_app``'s shifted clock, the package's injectable clock), another process resumes
it, and the resumed part is the same trace, its spans an hour after the park's, the
resume linked to the span that asked for it.

A failover (tests/test_failover.py's partition): worker A, cut off from the store mid-step,
loses its claim; worker B takes the step over: B's attempt is in the run's trace and names
the attempt it took over in ``saga.lost_attempt``."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace

from celery_saga import ExecutionState
from tests.conftest import (
    BROKERS,
    PORTS,
    require_services,
)
from tests.test_crash_recovery import wait_for
from tests.test_failover import PartitionRig, body_started
from tests.test_tracing_workers import TracedRig
from tests.tracing_kit import check_one_trace, collected, in_trace_of, run_span_names, sdk_provider

HOUR = 3600 * 1_000_000_000


@pytest.fixture(params=["postgres-rabbitmq", "postgres-redis"])
def shifted_rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TracedRig]:
    require_services(PORTS["postgres"], PORTS[request.param])
    rig = TracedRig(BROKERS[request.param], tmp_path, celery_spans=False)
    rig.env["SAGA_TEST_CLOCK_SHIFT"] = str(tmp_path / "clock-shift")
    try:
        yield rig
    finally:
        rig.close()


def test_a_park_then_a_resume_from_another_process_an_hour_later(shifted_rig: TracedRig) -> None:
    rig = shifted_rig
    rig.start_worker()
    switch = f"park-{uuid.uuid4().hex[:8]}"
    rig.client.set_switch(switch, True)
    plan = {"p1": {"undo_switch": switch}, "p3": {"fail": True}}
    with sdk_provider() as memory:
        with trace.get_tracer("test").start_as_current_span("POST /orders") as caller:
            run = rig.client.engine.start("traced_park", {"plan": plan})
        rig.run_until(run.id, ExecutionState.COMPENSATION_STUCK)
        time.sleep(0.5)
        parked = collected(memory, rig.spans)
        rig.client.set_switch(switch, False)
        Path(rig.env["SAGA_TEST_CLOCK_SHIFT"]).write_text("3600")
        resumed = subprocess.run(
            [sys.executable, "-m", "tests.traced_resume", run.id],
            env=rig.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        asked_by = resumed.stdout.split()[-1]
        ended = rig.run_until(run.id, ExecutionState.FAILED)
        assert ended.rollback_status.value == "completed"
        time.sleep(0.5)
        spans = collected(memory, rig.spans)
    _, mine = in_trace_of(caller, spans)
    check_one_trace(mine)
    assert run_span_names(mine) == {
        "saga traced_park": 1,
        **{f"step p{n}": 1 for n in (1, 2, 3)},
        "reversal p2": 1,
        "reversal p1": 2,
        "operator resume_compensation": 1,
    }
    root = next(s for s in mine if s["name"] == "saga traced_park")
    resume = next(s for s in mine if s["name"] == "operator resume_compensation")
    assert resume["parent"] == root["id"]
    assert [link["id"] for link in resume["links"]] == [asked_by]
    assert resume["attributes"]["saga.actor"] == "oncall"
    # Every span of the park ended before it; the resumed part began an hour after it.
    park_ended = max(s["end"] for s in parked if s["trace"] == root["trace"])
    assert HOUR <= resume["start"] - park_ended < HOUR + 30 * 1_000_000_000
    after = [
        s for s in mine if s["name"] == "reversal p1" and s["attributes"]["saga.outcome"] == "ran"
    ]
    assert len(after) == 1 and after[0]["start"] >= resume["start"]
    assert not [s for s in spans if s not in mine and s["attributes"].get("saga.name")]


def test_a_failover_takeover_keeps_the_trace_and_names_the_lost_attempt(tmp_path: Path) -> None:
    spans_folder = tmp_path / "spans"
    spans_folder.mkdir()
    extra = {"SAGA_TEST_SPANS": str(spans_folder)}
    rig = PartitionRig(tmp_path, app="tests.traced_app:app", extra=extra)
    try:
        plan = {"marathon": {"sleep": 25, "mark_begin": True, "tick": True, "fenced": True}}
        with sdk_provider() as memory:
            with trace.get_tracer("test").start_as_current_span("POST /long") as caller:
                run = rig.client.engine.start("long", {"order": 5, "plan": plan})
            wait_for(body_started(rig, run.id), timeout=30)
            holder = run.get().step("marathon").holder
            assert holder is not None and holder.startswith("w0-"), holder
            rig.start_b()
            rig.proxy.cut(40)  # A alone loses the store; B and beat keep it
            wait_for(lambda: run.get().state is ExecutionState.COMPLETED, timeout=60)
            time.sleep(1.0)
            spans = collected(memory, spans_folder)
    finally:
        rig.close()
    _, mine = in_trace_of(caller, spans)
    check_one_trace(mine)
    attempts = {s["attributes"]["saga.attempt"]: s for s in mine if s["name"] == "step marathon"}
    # A's pool process was killed as it lost the store (guarantee 30): attempt 1's span
    # ended with it, never exported; B's names it.
    assert set(attempts) == {2}
    taking_over = attempts[2]
    assert taking_over["attributes"]["saga.outcome"] == "ran"
    assert taking_over["attributes"]["saga.lost_attempt"] == 1
    assert not [s for s in spans if s not in mine and s["attributes"].get("saga.name")]
