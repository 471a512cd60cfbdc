"""Admission under a flow-control limit on each store (guarantee 37), with no worker: the
runs' messages go to an unconsumed queue, so what is stored is what ``start`` decided.

Concurrent starts of one key take exactly ``max`` slots (the key's first run included,
whose slot row two starts may race to create); a start under the limit costs one statement
more than a start of a saga without a limit; a saga without a limit costs nothing more.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event, select

from celery_saga import ExecutionState, Limit, Saga, SagaEngine
from celery_saga.store.tables import flow_slots
from celery_saga.worker.embedded import embedded_worker
from tests.conftest import unconsumed_app


def _noop() -> None:
    return None


def _limited(engine: SagaEngine, limit: int, total: int | None = None) -> str:
    name = f"flow{uuid.uuid4().hex[:8]}"
    saga = Saga(name, concurrency=Limit(key=lambda i: i["customer"], max=limit, total=total))
    engine.register(saga.step("pay", _noop))
    return name


def _live(engine: SagaEngine, saga: str, key: str) -> int | None:
    with engine.db.engine.connect() as connection:
        return connection.execute(
            select(flow_slots.c.live).where(
                flow_slots.c.saga_name == saga, flow_slots.c.flow_key == key
            )
        ).scalar()


@contextmanager
def _statements_of_this_thread(engine: SagaEngine) -> Iterator[list[str]]:
    seen: list[str] = []
    me = threading.get_ident()

    def on_execute(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        if threading.get_ident() == me and statement.split()[0].upper() not in (
            "BEGIN",
            "COMMIT",
            "SAVEPOINT",
            "RELEASE",
        ):
            seen.append(statement)

    event.listen(engine.db.engine, "before_cursor_execute", on_execute)
    try:
        yield seen
    finally:
        event.remove(engine.db.engine, "before_cursor_execute", on_execute)


def test_concurrent_starts_of_one_key_take_exactly_its_slots(direct: SagaEngine) -> None:
    name = _limited(direct, 3)
    with ThreadPoolExecutor(max_workers=8) as pool:
        ids = list(pool.map(lambda _: direct.start(name, {"customer": "c1"}).id, range(24)))
    states = [direct.get(i).state for i in ids]
    assert states.count(ExecutionState.RUNNING) == 3, states
    assert states.count(ExecutionState.QUEUED) == 21
    assert _live(direct, name, "c1") == 3


def test_concurrent_starts_under_a_saga_total_take_at_most_the_total(direct: SagaEngine) -> None:
    name = _limited(direct, 2, total=5)

    def start(n: int) -> tuple[str, str]:
        customer = f"c{n % 4}"
        return direct.start(name, {"customer": customer}).id, customer

    with ThreadPoolExecutor(max_workers=8) as pool:
        runs = list(pool.map(start, range(24)))
    running = [key for run_id, key in runs if direct.get(run_id).state is ExecutionState.RUNNING]
    assert len(running) == 5, running
    assert max(running.count(k) for k in set(running)) <= 2
    assert _live(direct, name, "") == 5
    assert sum(_live(direct, name, f"c{n}") or 0 for n in range(4)) == 5


def test_the_queued_are_told_where_they_stand(direct: SagaEngine) -> None:
    name = _limited(direct, 1)
    ids = [direct.start(name, {"customer": "c2"}).id for _ in range(4)]
    places = [direct.get(i).queued_behind for i in ids]
    assert places[0] is None
    assert [(p.key, p.ahead) for p in places[1:] if p is not None] == [
        ("c2", 0),
        ("c2", 1),
        ("c2", 2),
    ]


def test_a_start_under_the_limit_costs_one_statement_more(direct: SagaEngine) -> None:
    plain = f"plain{uuid.uuid4().hex[:8]}"
    direct.register(Saga(plain).step("pay", _noop))
    limited = _limited(direct, 1000)
    direct.start(plain, {})  # the version's shape is stored once per process: not counted
    direct.start(limited, {"customer": "c3"})  # the key's slot row is made once
    with _statements_of_this_thread(direct) as without:
        direct.start(plain, {})
    with _statements_of_this_thread(direct) as under:
        direct.start(limited, {"customer": "c3"})
    assert len(under) == len(without) + 1, (without, under)
    assert not any("saga_flow_slots" in s for s in without), "no limit, no slot statement"


def test_every_store_hands_slots_on_across_keys_under_a_total(store_url: str) -> None:
    """Runs to their end on an in-process worker over each store: the ending run's slot
    goes to the oldest queued run of a key with a slot free, under the store's own locks."""
    app = unconsumed_app("flow-total")
    app.conf.broker_transport_options = {"polling_interval": 0.01}
    engine = SagaEngine(app, store_url=store_url)
    name = _limited(engine, 1, total=2)
    ids = [engine.start(name, {"customer": f"c{n % 3}"}).id for n in range(9)]
    assert [engine.get(i).state for i in ids].count(ExecutionState.RUNNING) == 2
    with embedded_worker(app, concurrency=4):
        ended = [engine.handle(i).wait(60) for i in ids]
    assert {e.state for e in ended} == {ExecutionState.COMPLETED}
    assert _live(engine, name, "") == 0
    assert [_live(engine, name, f"c{n}") for n in range(3)] == [0, 0, 0]
    engine.db.dispose()
