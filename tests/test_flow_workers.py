"""Run concurrency by key with real prefork workers on PostgreSQL, over RabbitMQ and Redis
(guarantee 37), with a real ``celery beat``.

The saga ``keyed`` (tests/sagaapp.py) allows one live run per customer; its step writes a
ledger row when its body begins and when it ends, in one sequence across every process,
so a test replays who was inside at any moment.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from celery_saga import ExecutionState
from celery_saga.errors import StoreUnavailableError
from celery_saga.store.tables import flow_slots
from tests.sagaapp import ledger
from tests.test_crash_recovery import CrashRig, crash_rig, wait_for


def _start(rig: CrashRig, customer: str, plan: dict[str, Any]) -> str:
    run = rig.client.engine.start("keyed", {"customer": customer, "plan": {"pay": plan}})
    return str(run.id)


def _states(rig: CrashRig, ids: list[str]) -> list[ExecutionState]:
    return [rig.client.engine.get(i).state for i in ids]


def _ledger_rows(rig: Any, ids: list[str]) -> list[Any]:
    with rig.client.sql.begin() as connection:
        return list(
            connection.execute(
                select(ledger.c.id, ledger.c.execution_id, ledger.c.direction)
                .where(ledger.c.execution_id.in_(ids))
                .order_by(ledger.c.id)
            )
        )


@pytest.fixture(params=["postgres-rabbitmq", "postgres-redis"])
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CrashRig]:
    yield from crash_rig(request.param, tmp_path)


def _replay(rows: list[Any], key_of: dict[str, str]) -> tuple[dict[str, int], dict[str, list]]:
    """The most runs of each key inside a body at once, and each key's bodies in the order
    they began."""
    inside: dict[str, set[str]] = {}
    most: dict[str, int] = {}
    began: dict[str, list[str]] = {}
    for row in rows:
        key = key_of[row.execution_id]
        live = inside.setdefault(key, set())
        if row.direction == "forward_begin":
            live.add(row.execution_id)
            most[key] = max(most.get(key, 0), len(live))
            if row.execution_id not in began.setdefault(key, []):
                began[key].append(row.execution_id)
        elif row.direction == "forward":
            live.discard(row.execution_id)
    return most, began


def test_400_runs_over_20_keys_one_at_a_time_per_key_in_start_order(rig: CrashRig) -> None:
    rig.start_worker(count=2, concurrency=4)
    key_of: dict[str, str] = {}
    ids: list[str] = []
    prefix = uuid.uuid4().hex[:6]
    for index in range(400):
        customer = f"{prefix}-{index % 20}"
        run_id = _start(rig, customer, {"mark_begin": True, "sleep": 0.02})
        key_of[run_id] = customer
        ids.append(run_id)

    def all_completed() -> bool:
        return all(s is ExecutionState.COMPLETED for s in _states(rig, ids))

    wait_for(all_completed, 300)
    most, began = _replay(_ledger_rows(rig, ids), key_of)
    assert set(most.values()) == {1}, f"two live runs of one key at once: {most}"
    for customer in set(key_of.values()):
        started = [i for i in ids if key_of[i] == customer]
        assert began[customer] == started, f"{customer}: not in start order"


def test_a_killed_worker_holding_a_slot_frees_it_only_when_its_run_is_recovered(
    rig: CrashRig,
) -> None:
    worker = rig.start_worker()
    key = f"crash-{uuid.uuid4().hex[:6]}"
    holder = _start(rig, key, {"mark_begin": True, "first_sleep": 30})
    waiting = _start(rig, key, {"mark_begin": True})
    key_of = {holder: key, waiting: key}

    def holder_inside() -> bool:
        return any(r.direction == "forward_begin" for r in _ledger_rows(rig, [holder]))

    wait_for(holder_inside, 60)
    rig.kill(worker)
    assert _states(rig, [waiting]) == [ExecutionState.QUEUED]
    rig.start_worker()

    def both_completed() -> bool:
        return _states(rig, [holder, waiting]) == [ExecutionState.COMPLETED] * 2

    wait_for(both_completed, 120)
    rows = _ledger_rows(rig, [holder, waiting])
    most, _ = _replay(rows, key_of)
    assert most == {key: 1}, rows
    holder_done = max(r.id for r in rows if r.execution_id == holder and r.direction == "forward")
    waiting_began = min(r.id for r in rows if r.execution_id == waiting)
    assert waiting_began > holder_done, "the queued run started before the slot was given back"


def test_a_store_outage_during_admissions_loses_and_doubles_no_slot(tmp_path: Path) -> None:
    """Starts, ends and hand-ons meet a 30 s cut of the store: every write is retried or
    adopted (a start past its budget raises, and its caller starts the same id again),
    never two runs of a key live at once, and every slot is given back."""
    from tests.test_faults import FaultRig

    rig = FaultRig(tmp_path, sweep="1")
    try:
        engine = rig.client.engine
        key_of: dict[str, str] = {}
        prefix = uuid.uuid4().hex[:6]

        def start(index: int) -> None:
            customer = f"{prefix}-{index % 4}"
            plan = {"pay": {"mark_begin": True, "sleep": 0.2}}
            run_id = f"{prefix}-run-{index}"
            while True:  # a caller's retry of the same start (guarantee 28)
                try:
                    engine.start("keyed", {"customer": customer, "plan": plan}, execution_id=run_id)
                    break
                except StoreUnavailableError:
                    continue
            key_of[run_id] = customer

        for index in range(24):
            start(index)
        rig.proxy.cut(30)
        for index in range(24, 32):  # each waits out the outage within the retry budget
            start(index)
        ids = list(key_of)
        for run_id in ids:
            assert rig.wait_terminal(run_id, timeout=180).state is ExecutionState.COMPLETED
        most, _ = _replay(_ledger_rows(rig, ids), key_of)
        assert set(most.values()) == {1}, f"two live runs of one key at once: {most}"
        with engine.db.engine.connect() as connection:
            live = connection.execute(
                select(flow_slots.c.flow_key, flow_slots.c.live).where(
                    flow_slots.c.saga_name == "keyed",
                    flow_slots.c.flow_key.in_(set(key_of.values())),
                )
            ).all()
        assert {row.live for row in live} == {0}, f"a slot was not given back: {live}"
    finally:
        rig.close()


@pytest.fixture
def rabbit_rig(tmp_path: Path) -> Iterator[CrashRig]:
    yield from crash_rig("postgres-rabbitmq", tmp_path)


def test_a_flood_of_one_key_does_not_hold_back_the_other_keys(rabbit_rig: CrashRig) -> None:
    """1,000 runs of one key, then 20 of each of 10 other keys, at most 2 live per key, on
    2 workers of 4 slots: every other key's run ends while the flood still runs; the worst
    wait of another key's run (its start to its end) is printed."""
    rig, engine = rabbit_rig, rabbit_rig.client.engine
    rig.start_worker(count=2, concurrency=4)
    prefix = uuid.uuid4().hex[:6]

    def start(customer: str) -> str:
        return str(engine.start("pair_keyed", {"customer": f"{prefix}-{customer}"}).id)

    flood = [start("flood") for _ in range(1000)]
    others = [start(f"k{n % 10}") for n in range(200)]
    wait_for(lambda: _states(rig, others[-1:]) == [ExecutionState.COMPLETED], 600)
    wait_for(lambda: all(s is ExecutionState.COMPLETED for s in _states(rig, others)), 60)
    wait_for(lambda: _states(rig, flood[-1:]) == [ExecutionState.COMPLETED], 600)
    # How many flood runs ended while each other key's run lived: behind the flood's queue
    # it would be the flood's backlog (534 of 1,000 runs left when the others ended, on a
    # quiet machine); beside it, what the flood's two slots get through meanwhile. (A loaded
    # machine may start runs slower than the flood drains: no backlog, nothing to wait for.)
    lives = [engine.get(run_id).record for run_id in flood + others]
    flood_ends = sorted(record.updated_at for record in lives[: len(flood)])
    waits, behind = [], []
    for record in lives[len(flood) :]:
        waits.append((record.updated_at - record.created_at).total_seconds())
        behind.append(sum(record.created_at < end < record.updated_at for end in flood_ends))
    print(
        f"worst wait of another key's run: {max(waits):.1f} s; flood runs ended meanwhile:"
        f" at most {max(behind)}"
    )
    assert max(behind) < 150, "another key's run waited behind the flood"
