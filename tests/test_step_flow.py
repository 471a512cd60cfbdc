"""Step flow control by key (guarantee 37) on an in-process worker over SQLite: at most M
bodies of a step's task in flight per key across runs, the others waiting at its door
without a worker slot and sent on, oldest first, as slots free; and a rate per key.

A step's body writes to a ledger when it enters and leaves, so a test sees how many bodies
of a key were in flight at once.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import select

from celery_saga import (
    DefinitionError,
    ExecutionState,
    Limit,
    Rate,
    Saga,
    SagaContext,
    SagaEngine,
    step,
)
from celery_saga.decisions.step_flow import grant, next_turn, start_of, waits_in_place
from celery_saga.gauges import StoreGauges
from celery_saga.store import recovery
from celery_saga.store.tables import step_waits
from celery_saga.web import Credentials, WebSettings, create_app
from celery_saga.worker.embedded import embedded_worker
from tests.sagaapp import DuplicatingPublisher


class Ledger:
    """Bodies in flight per key: the most at once, and when each started."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inside: dict[str, int] = {}
        self.most: dict[str, int] = {}
        self.started: list[tuple[float, str, str]] = []  # (monotonic, key, run)

    def enter(self, key: str, run: str) -> None:
        with self.lock:
            self.started.append((time.monotonic(), key, run))
            self.inside[key] = self.inside.get(key, 0) + 1
            self.most[key] = max(self.most.get(key, 0), self.inside[key])

    def leave(self, key: str) -> None:
        with self.lock:
            self.inside[key] -= 1


class World:
    def __init__(self, tmp: Path) -> None:
        self.app = Celery(f"stepflow{uuid.uuid4().hex[:6]}", broker="memory://localhost/")
        self.app.conf.broker_transport_options = {"polling_interval": 0.01}
        self.engine = SagaEngine(self.app, store_url=f"sqlite:///{tmp}/stepflow.sqlite3")
        self.ledger = Ledger()

    def saga(self, *, sleep: float = 0.05, fail_first: bool = False, **limits: Any) -> str:
        """A saga of a plain first step, then ``call`` (limited by ``limits``), whose body
        is in the ledger for ``sleep`` s."""
        name = f"ship{uuid.uuid4().hex[:6]}"
        ledger, failed = self.ledger, set()

        def prepare(ctx: SagaContext) -> str:
            return "ready"

        def call(ctx: SagaContext) -> str:
            key = ctx.input["carrier"]
            ledger.enter(key, ctx.execution_id)
            time.sleep(sleep)
            ledger.leave(key)
            if fail_first and ctx.execution_id not in failed:
                failed.add(ctx.execution_id)
                raise RuntimeError("carrier busy")
            return "booked"

        saga = Saga(name).step("prepare", prepare)
        saga = saga.step("call", call, retry=2, backoff=0.05, **limits)
        self.engine.register(saga)
        return name

    def start_all(self, saga: str, keys: list[str]) -> list[str]:
        return [self.engine.start(saga, {"carrier": key}).id for key in keys]

    def all_completed(self, ids: list[str], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not all(self.engine.get(i).state.is_terminal for i in ids):
            assert time.monotonic() < deadline, "runs not ended"
            time.sleep(0.05)
        assert {self.engine.get(i).state for i in ids} == {ExecutionState.COMPLETED}

    def at_door(self, run: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout

        def came() -> bool:
            if any(started == run for _, _, started in self.ledger.started):
                return True  # no one ahead of it: straight through the door
            return "at the door" in (self.engine.inspect().run(run).waiting or "")

        while not came():
            assert time.monotonic() < deadline, "the run did not come to the door"
            time.sleep(0.01)

    def waits(self) -> int:
        with self.engine.db.engine.connect() as connection:
            return len(connection.execute(select(step_waits.c.record)).all())


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    made = World(tmp_path)
    with embedded_worker(made.app, concurrency=8):
        yield made


# -- the decisions --------------------------------------------------------------------
def test_a_door_starts_a_step_only_after_every_waiter_ahead_took_a_slot() -> None:
    assert grant(2, []) == (True, [])
    assert grant(2, ["a"]) == (True, ["a"])
    assert grant(2, ["a", "b"]) == (False, ["a", "b"])
    assert grant(0, ["a"]) == (False, [])
    assert grant(-1, []) == (False, [])  # a limit lowered below the slots held


def test_a_rate_books_turns_one_interval_apart() -> None:
    now, step_ = datetime(2026, 1, 1, tzinfo=UTC), timedelta(milliseconds=50)
    assert next_turn(None, now, step_) == (now, now + step_)
    assert next_turn(now + step_, now, step_) == (now + step_, now + 2 * step_)
    assert next_turn(now - step_, now, step_) == (now, now + step_)  # idle: no burst saved up
    # A message that came late starts a whole interval after the last start, not in a burst.
    assert start_of(now, None, step_) == now
    assert start_of(now, now - step_ / 5, step_) == now + step_ * 4 / 5
    assert waits_in_place(now + step_, now, step_)  # a turn away: waits in its worker
    assert not waits_in_place(now + 6 * step_, now, step_)  # far off: sent again for it


# -- bad input --------------------------------------------------------------------------
def test_a_step_limit_that_is_not_a_limit_is_refused() -> None:
    with pytest.raises(DefinitionError, match="concurrency= takes a Limit"):
        step("call", print, concurrency=5)  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match="rate= takes a Rate"):
        step("call", print, rate="20/s")  # type: ignore[arg-type]


def test_a_step_takes_a_limit_or_a_rate_and_no_total() -> None:
    with pytest.raises(DefinitionError, match="not both"):
        step("call", print, concurrency=Limit(max=2), rate=Rate("5/s"))
    with pytest.raises(DefinitionError, match="no total="):
        step("call", print, concurrency=Limit(key=lambda i: i, max=2, total=4))


def test_a_parallel_member_takes_no_step_limit() -> None:
    limited = step("call", print, concurrency=Limit(max=1))
    with pytest.raises(DefinitionError, match="group's members start together"):
        Saga("fan").parallel("both", limited, step("other", print))


# -- behaviour ----------------------------------------------------------------------------
def test_at_most_max_bodies_of_a_key_run_at_once_and_every_run_completes(world: World) -> None:
    saga = world.saga(concurrency=Limit(key=lambda i: i["carrier"], max=2))
    ids = world.start_all(saga, ["ups"] * 12 + ["dhl"] * 6)
    world.all_completed(ids)
    assert world.ledger.most == {"ups": 2, "dhl": 2}
    assert world.waits() == 0  # every slot given back, no waiter left behind


def test_waiters_start_in_the_order_they_came_to_the_door(world: World) -> None:
    saga = world.saga(sleep=0.5, concurrency=Limit(key=lambda i: i["carrier"], max=1))
    first = world.engine.start(saga, {"carrier": "ups"}).id
    time.sleep(0.3)  # the first holds the slot
    rest = []
    for _ in range(5):
        rest.append(world.engine.start(saga, {"carrier": "ups"}).id)
        world.at_door(rest[-1])  # each at the door before the next starts
    world.all_completed([first, *rest])
    order = [run for _, key, run in world.ledger.started if key == "ups"]
    assert order == [first, *rest]


def test_a_retried_attempt_gives_its_slot_back_meanwhile(world: World) -> None:
    saga = world.saga(fail_first=True, concurrency=Limit(key=lambda i: i["carrier"], max=1))
    ids = world.start_all(saga, ["ups"] * 4)
    world.all_completed(ids)
    assert world.ledger.most == {"ups": 1}
    assert len(world.ledger.started) == 8  # each failed once, then succeeded


def test_a_rate_spaces_the_bodies_of_a_key(world: World) -> None:
    saga = world.saga(sleep=0.0, rate=Rate("10/s", key=lambda i: i["carrier"]))
    ids = world.start_all(saga, ["ups"] * 12 + ["dhl"] * 3)
    world.all_completed(ids)
    ups = sorted(at for at, key, _ in world.ledger.started if key == "ups")
    # Starts 100 ms apart, late messages too: in any half second at most five, and one
    # more for the thread and poll jitter of the in-process worker between door and body.
    busiest = max(sum(1 for t in ups if a <= t < a + 0.5) for a in ups)
    assert busiest <= 6, [round(b - a, 3) for a, b in itertools.pairwise(ups)]
    assert ups[-1] - ups[0] >= 1.1 * 0.9  # never faster than the rate (late: slower)
    assert world.waits() == 0


def test_a_key_function_that_fails_fails_the_run_and_unwinds(world: World) -> None:
    saga = world.saga(concurrency=Limit(key=lambda i: i["account"], max=1))
    run = world.engine.start(saga, {"carrier": "ups"}).id
    deadline = time.monotonic() + 30
    while not world.engine.get(run).state.is_terminal:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    got = world.engine.get(run)
    assert got.state is ExecutionState.FAILED
    assert "concurrency key function raised KeyError" in (got.failure_reason or "")


def test_show_and_limits_say_who_waits_at_a_door(world: World) -> None:
    saga = world.saga(sleep=1.0, concurrency=Limit(key=lambda i: i["carrier"], max=1))
    ids = world.start_all(saga, ["ups"] * 3)
    deadline = time.monotonic() + 20
    views = []
    while time.monotonic() < deadline:
        views = [world.engine.inspect().run(i).waiting for i in ids]
        if (
            sum(
                "waiting for a slot of key 'ups' at the door of step 'call'" in (v or "")
                for v in views
            )
            == 2
        ):
            break
        time.sleep(0.05)
    else:
        raise AssertionError(views)
    # The web view renders the same read model's line (so does the Django admin's column).
    waiter = next(i for i, v in zip(ids, views, strict=True) if v and "at the door" in v)
    client = create_app(world.engine, WebSettings(Credentials("ops", "pw"))).test_client()
    page = client.get(f"/runs/{waiter}", auth=("ops", "pw")).get_data(as_text=True)
    assert "waiting for a slot of key &#39;ups&#39; at the door of step &#39;call&#39;" in page
    loads = [k for k in world.engine.inspect().limits() if k.kind == "step" and k.key == "ups"]
    assert [(k.live, k.limit, k.queued) for k in loads] == [(1, 1, 2)]
    assert loads[0].saga.endswith("call")  # the task the limit counts
    gauges = StoreGauges(world.engine.db)
    gauges.refresh()
    assert gauges.reading.at_doors[saga][0] == 2
    names = {metric.name for metric in gauges.collect()}
    assert {"saga_steps_at_door", "saga_oldest_step_at_door_age_seconds"} <= names
    world.all_completed(ids)
    assert world.waits() == 0


def test_a_door_costs_a_few_statements_and_an_unlimited_step_none(world: World) -> None:
    """What docs/flow-control.md says a door costs: counted on one run, alone at the door."""
    from celery import current_task
    from sqlalchemy import event

    sent: list[str] = []

    def record(_c: Any, _cursor: Any, sql: str, *_: Any) -> None:
        # Not the worker's sweeps (the one it sends as it starts may run meanwhile).
        sweeping = current_task and current_task.name.startswith("celery_saga.")
        if ("saga_step_waits" in sql or "saga_step_keys" in sql) and not sweeping:
            sent.append(sql.split()[0].upper())

    limited = world.saga(sleep=0.0, concurrency=Limit(key=lambda i: i["carrier"], max=2))
    rated = world.saga(sleep=0.0, rate=Rate("50/s", key=lambda i: i["carrier"]))
    plain = world.saga(sleep=0.0)
    counts = {}
    for saga in (limited, rated, plain):
        event.listen(world.engine.db.engine, "before_cursor_execute", record)
        try:
            world.all_completed([world.engine.start(saga, {"carrier": f"k-{saga}"}).id])
        finally:
            event.remove(world.engine.db.engine, "before_cursor_execute", record)
        counts[saga], sent[:] = list(sent), []
    print(counts)
    # The door: the key's row locked (made once per key), the step's place, the slots
    # held, the waiters ahead, its place written; after the attempt: the key's row, the
    # place deleted, the slots held, the waiters ahead.
    assert len(counts[limited]) <= 11, counts[limited]
    # A rate: the key's row, the place, the next turn, the last start.
    assert len(counts[rated]) <= 6, counts[rated]
    assert counts[plain] == []


def test_a_cancelled_run_waiting_at_a_door_never_makes_its_call(world: World) -> None:
    saga = world.saga(sleep=1.0, concurrency=Limit(key=lambda i: i["carrier"], max=1))
    holder = world.engine.start(saga, {"carrier": "ups"}).id
    world.at_door(holder)  # through it: its call holds the slot
    waiting = world.engine.start(saga, {"carrier": "ups"}).id
    world.at_door(waiting)
    world.engine.cancel(waiting, reason="customer changed their mind")
    deadline = time.monotonic() + 30
    while not world.engine.get(waiting).state.is_terminal:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    world.all_completed([holder])
    after = world.engine.start(saga, {"carrier": "ups"}).id  # the key goes on
    world.all_completed([after])
    assert world.engine.get(waiting).state is ExecutionState.CANCELLED
    called = [run for _, _, run in world.ledger.started]
    assert waiting not in called and holder in called and after in called
    assert world.waits() == 0


def test_the_recovery_sweep_reads_past_the_runs_waiting_at_a_door(world: World) -> None:
    """However many runs wait at a door, the sweep's query leaves them out: they hide no
    idle run behind them (its pages and its ``most`` count only runs it may act on)."""
    saga = world.saga(sleep=1.5, concurrency=Limit(key=lambda i: i["carrier"], max=1))
    holder = world.engine.start(saga, {"carrier": "ups"}).id
    world.at_door(holder)  # through it: its call holds the slot
    waiting = world.start_all(saga, ["ups"] * 4)
    for run in waiting:
        world.at_door(run)
    later = datetime.now(UTC) + timedelta(hours=1)  # every live run looks idle by then
    listed = [i for _, i in recovery.list_stale(world.engine.db, cutoff=later, limit=3)]
    assert listed == [holder]
    world.all_completed([holder, *waiting])


def test_a_duplicate_message_of_a_running_limited_step_frees_no_slot(world: World) -> None:
    """At-least-once delivery at its worst (every message sent twice): the duplicate of a
    step whose body runs passes its door (its slot), is refused its claim and leaves; its
    leave must not hand the slot that body still holds to a waiter."""
    single = world.engine.executor.publisher
    single.__class__ = DuplicatingPublisher
    saga = world.saga(sleep=0.3, concurrency=Limit(key=lambda i: i["carrier"], max=1))
    ids = world.start_all(saga, ["ups"] * 6)
    world.all_completed(ids)
    assert world.ledger.most["ups"] == 1
    assert sorted(run for _, _, run in world.ledger.started) == sorted(ids)  # each once
    assert world.waits() == 0
