"""Cancelling a run (guarantee 31), wherever it stands, on an in-process worker.

Each saga writes what its steps and compensations did to a list, so a test sees the order
of the reversals and that no step started after the cancel was stored.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_saga import (
    CancelVerdict,
    ExecutionState,
    InvalidStateError,
    Saga,
    SagaContext,
    SagaEngine,
    compensated_by,
    get_clock,
    step,
)
from celery_saga.store import queries
from celery_saga.worker.embedded import embedded_worker


class Shop:
    """A saga world of its own: an app, an engine on SQLite, and a journal of effects."""

    def __init__(self, tmp: Path) -> None:
        self.app = Celery(f"cancel{uuid.uuid4().hex[:6]}", broker="memory://localhost/")
        self.app.conf.broker_transport_options = {"polling_interval": 0.01}
        self.engine = SagaEngine(self.app, store_url=f"sqlite:///{tmp}/cancel.sqlite3")
        self.journal: list[str] = []
        self.lock = threading.Lock()

    def note(self, entry: str) -> None:
        with self.lock:
            self.journal.append(entry)

    def step(self, name: str, *, sleep: float = 0.0, cooperative: bool = False) -> Any:
        def undo(ctx: SagaContext) -> None:
            self.note(f"undo {name}")

        @compensated_by(undo)
        def action(ctx: SagaContext) -> str:
            self.note(f"do {name}")
            ends = time.monotonic() + sleep
            while time.monotonic() < ends:
                if cooperative and ctx.cancelled:
                    self.note(f"stopped {name}")
                    return "stopped"
                time.sleep(0.02)
            return name

        action.__name__ = name
        return action


@pytest.fixture
def shop(tmp_path: Path) -> Iterator[Shop]:
    world = Shop(tmp_path)
    with embedded_worker(world.app, concurrency=4):
        yield world


def _until(condition: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def _state(shop: Shop, execution_id: str) -> ExecutionState:
    return shop.engine.get(execution_id).state


def _ended(shop: Shop, execution_id: str) -> Any:
    _until(lambda: _state(shop, execution_id).is_terminal)
    return shop.engine.get(execution_id)


def test_a_run_waiting_at_a_gate_is_cancelled_and_unwound_in_reverse_start_order(
    shop: Shop,
) -> None:
    name = f"order{uuid.uuid4().hex[:6]}"
    shop.engine.register(
        Saga(name).step(shop.step("reserve")).step(shop.step("charge")).wait_for("approved")
    )
    run = shop.engine.start(name, {})
    _until(lambda: _state(shop, run.id) is ExecutionState.WAITING)
    assert shop.engine.cancel(run.id, "the customer changed their mind") is CancelVerdict.CANCEL
    execution = _ended(shop, run.id)
    assert execution.state is ExecutionState.CANCELLED
    assert execution.failure_reason == "CancelledError: the customer changed their mind"
    assert execution.rollback_status.value == "completed"
    assert shop.journal == ["do reserve", "do charge", "undo charge", "undo reserve"]
    assert [s.compensation_status.value for s in execution.steps] == ["compensated"] * 2


def test_a_running_body_that_checks_is_stopped_and_reversed_too(shop: Shop) -> None:
    """Under a pool that cannot stop a body, the body checks ``ctx.cancelled``; the step it
    cut short is reversed like a failed one (its effect may have landed, guarantee 6)."""
    name = f"ship{uuid.uuid4().hex[:6]}"
    shop.engine.register(
        Saga(name)
        .step(shop.step("reserve"))
        .step(shop.step("pack", sleep=30, cooperative=True))
        .step(shop.step("ship"))
    )
    run = shop.engine.start(name, {})
    _until(lambda: "do pack" in shop.journal)
    asked = time.monotonic()
    shop.engine.cancel(run.id)
    _until(lambda: "stopped pack" in shop.journal, timeout=5)
    assert time.monotonic() - asked < 2, "the body saw the cancel promptly"
    execution = _ended(shop, run.id)
    assert execution.state is ExecutionState.CANCELLED
    assert "do ship" not in shop.journal, "no step starts after the cancel is stored"
    assert shop.journal[-2:] == ["undo pack", "undo reserve"]
    assert execution.step("pack").status.value == "failed"


def test_a_step_waiting_for_its_retry_is_cancelled_without_running_again(shop: Shop) -> None:
    name = f"retry{uuid.uuid4().hex[:6]}"
    tries: list[int] = []

    def flaky(ctx: SagaContext) -> None:
        tries.append(ctx.attempt)
        raise TimeoutError("the warehouse did not answer")

    shop.engine.register(
        Saga(name).step(shop.step("reserve")).step("flaky", flaky, retry=3, backoff=30)
    )
    run = shop.engine.start(name, {})
    _until(lambda: tries == [1])
    _until(lambda: run.get().step("flaky").status.value == "pending")
    shop.engine.cancel(run.id)
    execution = _ended(shop, run.id)
    assert execution.state is ExecutionState.CANCELLED
    assert tries == [1], "the retry never ran"
    assert shop.journal == ["do reserve", "undo reserve"]


def test_a_run_past_its_pivot_or_ended_is_refused_and_nothing_is_stored(shop: Shop) -> None:
    name = f"pivot{uuid.uuid4().hex[:6]}"
    shop.engine.register(Saga(name).step(shop.step("charge")).pivot().wait_for("shipped"))
    run = shop.engine.start(name, {})
    _until(lambda: _state(shop, run.id) is ExecutionState.WAITING)
    before = queries.load_execution(shop.engine.db, run.id)
    with pytest.raises(
        InvalidStateError, match=r"passed its pivot \(the pivot after step 'charge'\)"
    ):
        shop.engine.cancel(run.id)
    assert queries.load_execution(shop.engine.db, run.id) == before

    done = f"done{uuid.uuid4().hex[:6]}"
    shop.engine.register(Saga(done).step(shop.step("only")))
    finished = shop.engine.start(done, {}).wait(15)
    with pytest.raises(InvalidStateError, match=r"has already ended \(completed\)"):
        shop.engine.cancel(finished.id)
    assert shop.engine.get(finished.id).state is ExecutionState.COMPLETED


def test_a_second_cancel_and_a_cancel_during_an_unwind_change_nothing(shop: Shop) -> None:
    name = f"twice{uuid.uuid4().hex[:6]}"
    gate = threading.Event()

    def slow_undo(ctx: SagaContext) -> None:
        gate.wait(10)
        shop.note("undo slow")

    @compensated_by(slow_undo)
    def slow(ctx: SagaContext) -> None:
        shop.note("do slow")

    def boom(ctx: SagaContext) -> None:
        raise RuntimeError("declined")

    shop.engine.register(Saga(name).step(slow).step("boom", boom))
    run = shop.engine.start(name, {})
    _until(lambda: _state(shop, run.id) is ExecutionState.COMPENSATING)
    assert shop.engine.cancel(run.id) is CancelVerdict.UNWINDING, "compensations are shielded"
    gate.set()
    execution = _ended(shop, run.id)
    assert execution.state is ExecutionState.FAILED, "a failure's unwind stays a failure"

    waiting = f"wait{uuid.uuid4().hex[:6]}"
    shop.engine.register(Saga(waiting).step(shop.step("a")).wait_for("go"))
    second = shop.engine.start(waiting, {})
    _until(lambda: _state(shop, second.id) is ExecutionState.WAITING)
    assert shop.engine.cancel(second.id) is CancelVerdict.CANCEL
    assert shop.engine.cancel(second.id) is CancelVerdict.ALREADY_CANCELLED
    assert _ended(shop, second.id).state is ExecutionState.CANCELLED
    assert shop.engine.cancel(second.id) is CancelVerdict.ALREADY_CANCELLED
    assert shop.journal.count("undo a") == 1


def test_a_signal_after_the_cancel_is_refused_and_changes_nothing(shop: Shop) -> None:
    name = f"sig{uuid.uuid4().hex[:6]}"
    shop.engine.register(Saga(name).step(shop.step("a")).wait_for("go").step(shop.step("b")))
    run = shop.engine.start(name, {})
    _until(lambda: _state(shop, run.id) is ExecutionState.WAITING)
    shop.engine.cancel(run.id)
    with pytest.raises(InvalidStateError):
        shop.engine.signal(run.id, "go")
    assert _ended(shop, run.id).state is ExecutionState.CANCELLED
    assert "do b" not in shop.journal


def test_a_parent_cancels_its_child_first_then_unwinds_itself(shop: Shop) -> None:
    child = f"child{uuid.uuid4().hex[:6]}"
    parent = f"parent{uuid.uuid4().hex[:6]}"
    shop.engine.register(Saga(child).step(shop.step("c1")).wait_for("go"))
    shop.engine.register(
        Saga(parent).step(shop.step("p1")).sub_saga(child, name="kid").step(shop.step("p2"))
    )
    run = shop.engine.start(parent, {})
    _until(lambda: "do c1" in shop.journal)
    kid = run.get().step("kid").child_execution_id
    assert kid is not None
    _until(lambda: _state(shop, kid) is ExecutionState.WAITING)
    shop.engine.cancel(run.id, "order withdrawn")
    execution = _ended(shop, run.id)
    assert execution.state is ExecutionState.CANCELLED
    assert shop.engine.get(kid).state is ExecutionState.CANCELLED
    assert shop.journal == ["do p1", "do c1", "undo c1", "undo p1"]


@pytest.mark.services
def test_a_prefork_body_is_stopped_within_two_seconds_and_its_step_reversed(
    tmp_path: Path,
) -> None:
    """Real prefork workers: Celery's revoke with the soft time limit's signal stops the
    30 s body where it is; the step it cut short and the one before are reversed once."""
    from tests.test_faults import FaultRig

    rig = FaultRig(tmp_path)
    try:
        plan = {"b": {"sleep": 30, "mark_begin": True, "tick": True}}
        run = rig.client.engine.start("failed_eligible", {"order": 5, "plan": plan})
        entries = rig.client.entries
        _until(lambda: any(e.direction == "tick" for e in entries(run.id)), timeout=30)
        assert rig.client.engine.cancel(run.id, "fraud suspected") is CancelVerdict.CANCEL
        time.sleep(2.0)
        ticks = sum(e.direction == "tick" for e in entries(run.id))
        time.sleep(1.0)
        assert sum(e.direction == "tick" for e in entries(run.id)) == ticks, "still running"
        _until(lambda: rig.client.engine.get(run.id).state.is_terminal, timeout=60)
        execution = rig.client.engine.get(run.id)
        assert execution.state is ExecutionState.CANCELLED
        assert execution.failure_reason == "CancelledError: fraud suspected"
        done = [(e.step, e.direction) for e in entries(run.id) if e.direction != "tick"]
        assert done == [
            ("a", "forward"),
            ("b", "forward_begin"),
            ("b", "compensate"),
            ("a", "compensate"),
        ], "b never finished; both reversed once, in reverse start order"
        # Celery's own record of the stopped task, as Flower shows it
        task_id = (execution.step("b").holder or "").rsplit("/", 1)[-1]
        assert rig.client.app.AsyncResult(task_id).state == "REVOKED"
    finally:
        rig.close()


def test_a_saga_deadline_cancels_a_waiting_run_across_a_worker_restart(tmp_path: Path) -> None:
    shop = Shop(tmp_path)
    name = f"late{uuid.uuid4().hex[:6]}"
    shop.engine.register(Saga(name, timeout=1.5).step(shop.step("reserve")).wait_for("approved"))
    with embedded_worker(shop.app, concurrency=2):
        run = shop.engine.start(name, {})
        _until(lambda: _state(shop, run.id) is ExecutionState.WAITING)
        assert shop.engine.fire_timers() == 0, "not due yet"
    time.sleep(1.6)  # the deadline passes while no worker runs
    with embedded_worker(shop.app, concurrency=2):
        assert shop.engine.fire_timers() == 1
        execution = _ended(shop, run.id)
        assert shop.engine.fire_timers() == 0, "a deadline fires once"
    assert execution.state is ExecutionState.CANCELLED
    assert execution.failure_reason == "CancelledError: deadline"
    assert shop.journal == ["do reserve", "undo reserve"]


def test_a_deadline_that_passes_after_the_run_ended_changes_nothing(shop: Shop) -> None:
    name = f"quick{uuid.uuid4().hex[:6]}"
    shop.engine.register(Saga(name).step(shop.step("only")))
    run = shop.engine.start(name, {}, timeout=0.3)
    assert run.wait(15).state is ExecutionState.COMPLETED
    time.sleep(0.4)
    assert shop.engine.fire_timers() == 0
    assert shop.engine.get(run.id).state is ExecutionState.COMPLETED
    assert queries.load_execution(shop.engine.db, run.id).deadline_at is None


@pytest.mark.parametrize("timeout", [0, -1, "soon", True])
def test_a_bad_deadline_is_refused_before_anything_is_stored(shop: Shop, timeout: Any) -> None:
    from celery_saga import DefinitionError

    with pytest.raises(DefinitionError, match="timeout= takes a positive number"):
        Saga(f"bad{uuid.uuid4().hex[:6]}", timeout=timeout)
    name = f"ok{uuid.uuid4().hex[:6]}"
    shop.engine.register(Saga(name).step(shop.step("only")))
    with pytest.raises(DefinitionError, match="timeout= takes a positive number"):
        shop.engine.start(name, {}, timeout=timeout)
    assert shop.engine.list(saga=name).items == ()


def _every_done_step_undone_once(journal: list[str], prefix: str) -> None:
    done = [e.split(" ", 1)[1] for e in journal if e.startswith(f"do {prefix}")]
    undone = [e.split(" ", 1)[1] for e in journal if e.startswith(f"undo {prefix}")]
    assert sorted(done) == sorted(undone), journal


def test_cancel_races_the_last_step_completing_and_one_of_them_wins(shop: Shop) -> None:
    """100 races: the run ends completed (the cancel refused, nothing reversed) or
    cancelled (unwound, the cancel stored first), never both."""
    name = f"race{uuid.uuid4().hex[:6]}"
    shop.engine.register(Saga(name).step(shop.step("first")).step(shop.step("last", sleep=0.01)))
    outcomes = {"completed": 0, "cancelled": 0}
    for index in range(100):
        run = shop.engine.start(name, {}, execution_id=f"{name}-{index}")
        time.sleep(0.002 * (index % 40))  # from before the first step to after the last
        try:
            verdict = shop.engine.cancel(run.id)
        except InvalidStateError:
            verdict = None
        execution = _ended(shop, run.id)
        outcomes[execution.state.value] += 1
        journal = list(shop.journal)
        if execution.state is ExecutionState.COMPLETED:
            assert verdict is None, "a completed run was never cancelled"
            assert all(c.compensation_status is None for c in execution.steps)
        else:
            assert execution.state is ExecutionState.CANCELLED
            assert verdict is CancelVerdict.CANCEL
            assert all(c.compensation_status.value == "compensated" for c in execution.steps)
        shop.journal.clear()
        if verdict is not None:
            _every_done_step_undone_once(journal, "")
    assert outcomes["completed"] + outcomes["cancelled"] == 100, outcomes


@pytest.mark.parametrize("rival_kind", ["signal", "timeout"])
def test_cancel_races_a_signal_or_a_waits_timeout_and_one_of_them_wins(
    shop: Shop, rival_kind: str
) -> None:
    """100 races each: the run ends cancelled (the cancel stored first) or goes on as the
    signal or the timeout took it, never both; each step reversed at most once."""
    name = f"gate{uuid.uuid4().hex[:6]}"
    shop.engine.register(
        Saga(name).step(shop.step("a")).wait_for("go", timeout=0.2).step(shop.step("b"))
    )
    for index in range(100):
        run = shop.engine.start(name, {}, execution_id=f"{name}-{index}")
        _until(lambda rid=run.id: _state(shop, rid) is ExecutionState.WAITING)
        if rival_kind == "timeout":
            time.sleep(0.2)  # the wait's deadline passes: the timer sweep races the cancel
            rival = threading.Thread(target=shop.engine.fire_timers)
        else:
            rival = threading.Thread(target=_signal_quietly, args=(shop, run.id))
        rival.start()
        try:
            cancelled = shop.engine.cancel(run.id) is CancelVerdict.CANCEL
        except InvalidStateError:
            cancelled = False
        rival.join()
        execution = _ended(shop, run.id)
        if cancelled:
            assert execution.state is ExecutionState.CANCELLED
        else:
            assert execution.state in (ExecutionState.COMPLETED, ExecutionState.FAILED)
        reversals = [c for c in execution.steps if c.compensation_status is not None]
        assert len({c.name for c in reversals}) == len(reversals), "each reversed once"
        journal = list(shop.journal)
        shop.journal.clear()
        assert journal.count("undo a") <= 1


def _signal_quietly(shop: Shop, execution_id: str) -> None:
    with contextlib.suppress(InvalidStateError):
        shop.engine.signal(execution_id, "go")


def test_the_cancel_command_cancels_says_so_twice_and_refuses_an_ended_run(shop: Shop) -> None:
    from click.testing import CliRunner

    from celery_saga.cli.commands import saga as saga_cli

    def invoke(*args: str) -> Any:
        return CliRunner().invoke(saga_cli, list(args), obj=SimpleNamespace(app=shop.app))

    name = f"cli{uuid.uuid4().hex[:6]}"
    shop.engine.register(Saga(name).step(shop.step("a")).wait_for("go"))
    run = shop.engine.start(name, {})
    _until(lambda: _state(shop, run.id) is ExecutionState.WAITING)
    first = invoke("cancel", run.id, "--reason", "duplicate order")
    assert first.exit_code == 0, first.output
    assert first.output.strip() == f"cancelled {run.id}; what it did is unwound by the workers"
    again = invoke("cancel", run.id)
    assert again.output.strip() == f"execution {run.id} is already cancelled; nothing changed"
    assert _ended(shop, run.id).failure_reason == "CancelledError: duplicate order"
    shown = invoke("show", run.id)
    assert "state=cancelled" in shown.output, shown.output
    done = f"fin{uuid.uuid4().hex[:6]}"
    shop.engine.register(Saga(done).step(shop.step("only")))
    finished = shop.engine.start(done, {}).wait(15)
    refused = invoke("cancel", finished.id)
    assert refused.exit_code == 1
    assert "has already ended (completed): it cannot be cancelled" in refused.output


def _cancel_at(shop: Shop, name: str, reached: Any, runs: int = 20) -> list[Any]:
    """Start ``runs`` runs one after the other, cancel each once ``reached(run)``, and
    return how each ended with its journal."""
    ended = []
    for index in range(runs):
        shop.journal.clear()
        run = shop.engine.start(name, {}, execution_id=f"{name}-{index}")
        _until(lambda run=run: reached(run))
        assert shop.engine.cancel(run.id) is CancelVerdict.CANCEL
        ended.append((_ended(shop, run.id), list(shop.journal)))
    return ended


def test_a_cancel_while_parallel_members_run_stops_them_and_reverses_all(shop: Shop) -> None:
    """20 runs: both running members stop, and they and the step before are reversed."""
    name = f"par{uuid.uuid4().hex[:6]}"
    members = [step(f"m{i}", shop.step(f"m{i}", sleep=30, cooperative=True)) for i in (1, 2)]
    shop.engine.register(Saga(name).step(shop.step("first")).parallel("group", *members))
    running = lambda run: {"do m1", "do m2"} <= set(shop.journal)  # noqa: E731
    for execution, journal in _cancel_at(shop, name, running):
        assert execution.state is ExecutionState.CANCELLED
        assert {"stopped m1", "stopped m2"} <= set(journal)
        undone = [e for e in journal if e.startswith("undo")]
        assert sorted(undone[:2]) == ["undo m1", "undo m2"] and undone[2:] == ["undo first"]


def test_a_cancel_inside_a_loop_reverses_the_iterations_done_and_the_one_cut_short(
    shop: Shop,
) -> None:
    """20 runs: iteration 1 is running when the cancel comes; iteration 2 never starts."""
    name = f"loop{uuid.uuid4().hex[:6]}"

    def pack(ctx: SagaContext) -> str:
        shop.note(f"do pack:{ctx.iteration}")
        ends = time.monotonic() + (30 if ctx.iteration == 1 else 0)
        while time.monotonic() < ends and not ctx.cancelled:
            time.sleep(0.02)
        return str(ctx.item)

    body = step("pack", pack, compensate=lambda ctx: shop.note(f"undo pack:{ctx.iteration}"))
    shop.engine.register(Saga(name).for_each(lambda ctx: ["x", "y", "z"], body))
    inside = lambda run: "do pack:1" in shop.journal  # noqa: E731
    for execution, journal in _cancel_at(shop, name, inside):
        assert execution.state is ExecutionState.CANCELLED
        assert "do pack:2" not in journal, "no iteration starts after the cancel"
        assert [e for e in journal if e.startswith("undo")] == ["undo pack:1", "undo pack:0"]


def test_a_cancel_at_a_gate_or_before_a_retry_twenty_times_over(shop: Shop) -> None:
    gate = f"gate20{uuid.uuid4().hex[:6]}"
    shop.engine.register(Saga(gate).step(shop.step("a")).step(shop.step("b")).wait_for("go"))
    waiting = lambda run: run.get().state is ExecutionState.WAITING  # noqa: E731
    for execution, journal in _cancel_at(shop, gate, waiting):
        assert execution.state is ExecutionState.CANCELLED
        assert journal == ["do a", "do b", "undo b", "undo a"]

    retry = f"retry20{uuid.uuid4().hex[:6]}"

    def flaky(ctx: SagaContext) -> None:
        shop.note("do flaky")
        raise TimeoutError("no answer")

    shop.engine.register(Saga(retry).step(shop.step("a")).step("flaky", flaky, retry=3, backoff=30))
    pending = lambda run: any(  # noqa: E731
        s.name == "flaky" and s.status.value == "pending" for s in run.get().steps
    )
    for execution, journal in _cancel_at(shop, retry, pending):
        assert execution.state is ExecutionState.CANCELLED
        assert journal == ["do a", "do flaky", "undo a"]


def test_a_cancel_of_a_running_body_or_of_a_parent_twenty_times_over(shop: Shop) -> None:
    body = f"body20{uuid.uuid4().hex[:6]}"
    shop.engine.register(
        Saga(body)
        .step(shop.step("a"))
        .step(shop.step("long", sleep=30, cooperative=True))
        .step(shop.step("c"))
    )
    running = lambda run: "do long" in shop.journal  # noqa: E731
    for execution, journal in _cancel_at(shop, body, running):
        assert execution.state is ExecutionState.CANCELLED
        assert journal == ["do a", "do long", "stopped long", "undo long", "undo a"]

    child, parent = f"kid20{uuid.uuid4().hex[:6]}", f"mum20{uuid.uuid4().hex[:6]}"
    shop.engine.register(Saga(child).step(shop.step("c1")).wait_for("go"))
    shop.engine.register(
        Saga(parent).step(shop.step("p1")).sub_saga(child, name="kid").step(shop.step("p2"))
    )

    def in_child(run: Any) -> bool:
        kids = [s.child_execution_id for s in run.get().steps if s.child_execution_id]
        return "do c1" in shop.journal and any(
            _state(shop, kid) is ExecutionState.WAITING for kid in kids
        )

    for execution, journal in _cancel_at(shop, parent, in_child):
        assert execution.state is ExecutionState.CANCELLED
        kid = execution.step("kid").child_execution_id
        assert shop.engine.get(kid).state is ExecutionState.CANCELLED
        assert journal == ["do p1", "do c1", "undo c1", "undo p1"]


def test_the_cancel_is_an_event_with_its_reason(shop: Shop) -> None:
    seen: list[dict[str, Any]] = []
    shop.engine.on("saga-cancelled", lambda event, fields: seen.append(fields))
    name = f"evt{uuid.uuid4().hex[:6]}"
    shop.engine.register(Saga(name).step(shop.step("a")).wait_for("go"))
    run = shop.engine.start(name, {})
    _until(lambda: _state(shop, run.id) is ExecutionState.WAITING)
    shop.engine.cancel(run.id, "out of stock")
    assert seen == [{"execution_id": run.id, "saga": name, "reason": "out of stock"}]


def test_a_cancel_retried_after_its_reply_was_lost_finishes_what_it_began(shop: Shop) -> None:
    """The cancel's write landed but its caller never heard (the store's reply was lost),
    and it calls again: the run is cancelled already, and the call carries the cancel on
    instead of leaving the run for the recovery sweep."""
    from celery_saga.store import cancel as stored

    name = f"lost{uuid.uuid4().hex[:6]}"
    shop.engine.register(Saga(name).step(shop.step("a")).wait_for("go"))
    run = shop.engine.start(name, {})
    _until(lambda: _state(shop, run.id) is ExecutionState.WAITING)
    reason = stored.cancel_reason("lost reply")
    assert stored.request_cancel(
        shop.engine.db, execution_id=run.id, reason=reason, now=get_clock().now()
    )
    assert _state(shop, run.id) is ExecutionState.CANCELLING
    assert shop.engine.cancel(run.id, "lost reply") is CancelVerdict.ALREADY_CANCELLED
    execution = _ended(shop, run.id)
    assert execution.state is ExecutionState.CANCELLED
    assert shop.journal == ["do a", "undo a"]
