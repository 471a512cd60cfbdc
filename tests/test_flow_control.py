"""Run concurrency by key (guarantee 37) on an in-process worker over SQLite: at most N live
runs per key, the others stored ``queued`` and started, in start order, by the run of their
key that ends, whichever way it ends (completed, failed, unwound, cancelled, abandoned).

Each step writes to a ledger when its body enters and leaves, so a test sees which runs
of a key were live at once.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import select

from celery_saga import (
    CancelVerdict,
    DefinitionError,
    ExecutionState,
    Limit,
    Rate,
    Saga,
    SagaContext,
    SagaEngine,
    SagaError,
    compensated_by,
)
from celery_saga.decisions.flow import FlowVerdict, admit, slots_to_hand_on
from celery_saga.store.tables import executions, flow_slots, history
from celery_saga.worker.embedded import embedded_worker


class Ledger:
    """Who entered and left a body, in order, and the most of one key inside at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[str, str, str]] = []  # (enter|leave, key, run)
        self.inside: dict[str, int] = {}
        self.most: dict[str, int] = {}
        self.most_at_once = 0

    def enter(self, key: str, run: str) -> None:
        with self.lock:
            self.events.append(("enter", key, run))
            self.inside[key] = self.inside.get(key, 0) + 1
            self.most[key] = max(self.most.get(key, 0), self.inside[key])
            self.most_at_once = max(self.most_at_once, sum(self.inside.values()))

    def leave(self, key: str, run: str) -> None:
        with self.lock:
            self.events.append(("leave", key, run))
            self.inside[key] -= 1

    def order(self, key: str) -> list[str]:
        return [run for kind, k, run in self.events if kind == "enter" and k == key]


class World:
    def __init__(self, tmp: Path) -> None:
        self.app = Celery(f"flow{uuid.uuid4().hex[:6]}", broker="memory://localhost/")
        self.app.conf.broker_transport_options = {"polling_interval": 0.01}
        self.engine = SagaEngine(self.app, store_url=f"sqlite:///{tmp}/flow.sqlite3")
        self.ledger = Ledger()

    def saga(
        self, limit: int, *, sleep: float = 0.05, fail: bool = False, total: int | None = None
    ) -> str:
        """A saga of one step per run, whose body is in the ledger for ``sleep`` s."""
        name = f"order{uuid.uuid4().hex[:6]}"
        ledger = self.ledger

        def undo(ctx: SagaContext) -> None:
            ledger.events.append(("undo", ctx.input["customer"], ctx.execution_id))

        @compensated_by(undo)
        def pay(ctx: SagaContext) -> str:
            ledger.enter(ctx.input["customer"], ctx.execution_id)
            time.sleep(sleep)
            ledger.leave(ctx.input["customer"], ctx.execution_id)
            if fail:
                raise RuntimeError("card declined")
            return "paid"

        per_key = Limit(key=lambda i: i["customer"], max=limit, total=total)
        saga = Saga(name, concurrency=per_key)
        self.engine.register(saga.step("pay", pay, retry=1))
        return name

    def state(self, run_id: str) -> ExecutionState:
        return self.engine.get(run_id).state

    def slots(self, saga: str) -> dict[str, int]:
        with self.engine.db.engine.connect() as connection:
            rows = connection.execute(
                select(flow_slots.c.flow_key, flow_slots.c.live).where(
                    flow_slots.c.saga_name == saga
                )
            )
            return {row.flow_key: row.live for row in rows}

    def admitted(self) -> list[str]:
        """The runs handed a slot as another ended, in the order the store committed it."""
        with self.engine.db.engine.connect() as connection:
            rows = connection.execute(
                select(history.c.execution_id)
                .where(history.c.kind == "admitted")
                .order_by(history.c.id)
            )
            return [row.execution_id for row in rows]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    made = World(tmp_path)
    with embedded_worker(made.app, concurrency=6):
        yield made


def _until(condition: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def _all_ended(world: World, ids: list[str]) -> None:
    _until(lambda: all(world.state(i).is_terminal for i in ids))


# -- the decisions --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("live", "limit", "verdict"),
    [(0, 1, FlowVerdict.ADMIT), (1, 1, FlowVerdict.QUEUE), (2, 5, FlowVerdict.ADMIT)],
)
def test_a_run_is_admitted_only_while_its_key_has_a_free_slot(
    live: int, limit: int, verdict: FlowVerdict
) -> None:
    assert admit(live, limit) is verdict


def test_a_freed_slot_starts_at_most_what_the_limit_allows() -> None:
    assert slots_to_hand_on(0, 1, 5) == 1
    assert slots_to_hand_on(1, 4, 9) == 3  # the limit was raised
    assert slots_to_hand_on(3, 2, 9) == 0  # the limit was lowered
    assert slots_to_hand_on(0, 3, 1) == 1


# -- bad input --------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_a_limit_of_no_slot_is_refused(bad: Any) -> None:
    with pytest.raises(DefinitionError, match="max"):
        Limit(key=None, max=bad)


def test_a_concurrency_that_is_not_a_limit_is_refused() -> None:
    with pytest.raises(DefinitionError, match="concurrency= takes a Limit"):
        Saga("x", concurrency=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(("spec", "per_second"), [("20/s", 20.0), ("90/m", 1.5), ("36/h", 0.01)])
def test_a_rate_reads_as_calls_per_second(spec: str, per_second: float) -> None:
    assert Rate(spec).per_second == pytest.approx(per_second)


@pytest.mark.parametrize("bad", ["20", "x/s", "0/s", "20/d", 20])
def test_a_rate_that_cannot_be_read_is_refused(bad: Any) -> None:
    with pytest.raises(DefinitionError, match="Rate"):
        Rate(bad)


def test_a_key_that_cannot_be_stored_is_refused_and_nothing_is_stored(world: World) -> None:
    name = world.saga(1)
    for bad in ({"customer": None}, {"customer": "x" * 201}, {}, {"customer": ""}):
        with pytest.raises(SagaError, match="concurrency key"):
            world.engine.start(name, bad)
    assert not world.engine.list(saga=name).items
    assert world.slots(name) == {}


# -- the limit --------------------------------------------------------------------------
def test_beyond_the_limit_a_run_is_queued_and_starts_when_its_key_frees_in_start_order(
    world: World,
) -> None:
    name = world.saga(1, sleep=0.15)
    ids = {c: [world.engine.start(name, {"customer": c}).id for _ in range(4)] for c in "ab"}
    assert [world.state(i) for i in ids["a"][1:]] == [ExecutionState.QUEUED] * 3
    _all_ended(world, ids["a"] + ids["b"])
    for customer, runs in ids.items():
        assert world.ledger.order(customer) == runs, "each key's runs in start order"
        assert world.ledger.most[customer] == 1, "never two live runs of one key"
        assert all(world.state(i) is ExecutionState.COMPLETED for i in runs)
    assert world.slots(name) == {"a": 0, "b": 0}, "every slot given back"


def test_a_queued_run_is_announced_started_once_when_it_starts(world: World) -> None:
    name = world.saga(1, sleep=0.1)
    started: list[str] = []
    world.engine.on("saga-started", lambda _, fields: started.append(fields["execution_id"]))
    first, second = (world.engine.start(name, {"customer": "e"}).id for _ in range(2))
    assert started == [first], "a queued run is not started yet"
    _all_ended(world, [first, second])
    assert started == [first, second]


def test_a_queued_run_shows_its_key_and_how_many_are_ahead(world: World) -> None:
    name = world.saga(1, sleep=0.5)
    first, second, third = (world.engine.start(name, {"customer": "c"}).id for _ in range(3))
    third_run = world.engine.get(third)
    assert third_run.state is ExecutionState.QUEUED
    place = third_run.queued_behind
    assert place is not None and (place.key, place.ahead) == ("c", 1)
    assert world.engine.get(first).queued_behind is None
    _all_ended(world, [first, second, third])


def test_a_limit_of_two_keeps_two_live(world: World) -> None:
    name = world.saga(2, sleep=0.1)
    ids = [world.engine.start(name, {"customer": "k"}).id for _ in range(6)]
    _all_ended(world, ids)
    assert world.ledger.most["k"] == 2
    assert set(world.ledger.order("k")[:2]) == set(ids[:2]), "the first two start at once"


def test_under_a_saga_total_a_flooded_key_does_not_starve_the_others(world: World) -> None:
    """60 runs of one key, then 2 of each of 5 others, at most 2 per key and 3 in all: a
    slot that frees goes to the run queued longest among the keys with a slot free, so the
    others finish while the flood still runs, not after it."""
    name = world.saga(2, sleep=0.05, total=3)
    flood = [world.engine.start(name, {"customer": "flood"}).id for _ in range(60)]
    others = [world.engine.start(name, {"customer": f"k{n % 5}"}).id for n in range(10)]
    _all_ended(world, flood + others)
    assert world.ledger.most_at_once == 3, "never more than the total live"
    assert max(world.ledger.most.values()) == 2, "never more than a key's limit"
    # The order slots were handed in, as stored: the order bodies enter may differ by more
    # than a pair on a loaded machine (a thread given its message late), the decision not.
    admitted = world.admitted()
    assert [run for run in admitted if run in flood] == flood[2:], "start order"
    last_other = max(admitted.index(run) for run in others if run in admitted)
    assert last_other < admitted.index(flood[-1]) - 20, "the others went while the flood waited"
    assert world.slots(name) == {"": 0, "flood": 0, **{f"k{n}": 0 for n in range(5)}}


def test_a_total_without_a_key_or_below_one_is_refused() -> None:
    with pytest.raises(DefinitionError, match="needs a key"):
        Limit(max=2, total=5)
    with pytest.raises(DefinitionError, match="total"):
        Limit(key=lambda i: i["x"], max=2, total=0)


def test_a_run_that_fails_and_unwinds_hands_its_slot_on(world: World) -> None:
    name = world.saga(1, fail=True)
    ids = [world.engine.start(name, {"customer": "f"}).id for _ in range(3)]
    _all_ended(world, ids)
    assert world.ledger.order("f") == ids
    assert all(world.state(i) is ExecutionState.FAILED for i in ids)
    assert world.slots(name) == {"f": 0}


def test_a_cancelled_queued_run_never_starts_and_the_key_goes_on(world: World) -> None:
    name = world.saga(1, sleep=0.3)
    first, second, third = (world.engine.start(name, {"customer": "q"}).id for _ in range(3))
    assert world.engine.cancel(second, "changed my mind") is CancelVerdict.CANCEL
    cancelled = world.engine.get(second)
    assert cancelled.state is ExecutionState.CANCELLED
    assert cancelled.rollback_status is not None
    _all_ended(world, [first, third])
    assert world.ledger.order("q") == [first, third], "the cancelled run never started"
    assert world.state(third) is ExecutionState.COMPLETED
    assert world.slots(name) == {"q": 0}


def test_a_cancelled_running_run_hands_its_slot_on(world: World) -> None:
    name = world.saga(1, sleep=0.4)
    first, second = (world.engine.start(name, {"customer": "r"}).id for _ in range(2))
    _until(lambda: world.ledger.order("r") == [first])
    world.engine.cancel(first)
    _all_ended(world, [first, second])
    assert world.state(first) is ExecutionState.CANCELLED
    assert world.state(second) is ExecutionState.COMPLETED
    assert world.slots(name) == {"r": 0}


def test_a_saga_without_a_limit_stores_no_key(world: World) -> None:
    name = f"plain{uuid.uuid4().hex[:6]}"
    world.engine.register(Saga(name).step("one", lambda: "done"))
    run = world.engine.start(name, {})
    _all_ended(world, [run.id])
    with world.engine.db.engine.connect() as connection:
        key = connection.execute(
            select(executions.c.flow_key).where(executions.c.id == run.id)
        ).scalar()
    assert key is None
    assert world.slots(name) == {}


def test_a_cancelled_parent_cancels_its_queued_child_which_never_starts(world: World) -> None:
    child = world.saga(1, sleep=0.5)
    parent = f"parent{uuid.uuid4().hex[:6]}"
    world.engine.register(Saga(parent).sub_saga(child))
    first = world.engine.start(parent, {"customer": "p"}).id
    _until(lambda: world.ledger.order("p") != [])
    second = world.engine.start(parent, {"customer": "p"}).id
    _until(lambda: len(world.engine.get(second).steps) == 1)
    queued_child = world.engine.get(second).steps[0].child_execution_id
    assert queued_child is not None
    _until(lambda: world.state(queued_child) is ExecutionState.QUEUED)
    world.engine.cancel(second)
    _all_ended(world, [first, second, queued_child])
    assert world.state(second) is ExecutionState.CANCELLED
    assert world.state(queued_child) is ExecutionState.CANCELLED
    assert len(world.ledger.order("p")) == 1, "the queued child never started"
    assert world.slots(child) == {"p": 0}
