"""Issue 42: held runs in the store's gauges: ``saga_runs{state="held"}`` and how long each
saga's longest held run has waited for an operator."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import update

from celery_saga import Saga, SagaEngine
from celery_saga.gauges import StoreGauges
from celery_saga.records import ExecutionState
from celery_saga.store.database import to_db_time
from celery_saga.store.tables import executions
from celery_saga.testing.clock import ControlledClock
from tests.conftest import unconsumed_app
from tests.test_metrics import value
from tests.test_store_gauges import _scraped


def test_held_runs_are_counted_and_the_longest_hold_is_aged(
    tmp_path: Path, saga_clock: ControlledClock
) -> None:
    engine = SagaEngine(unconsumed_app("gauges"), store_url=f"sqlite:///{tmp_path}/g.sqlite3")
    engine.register(Saga("order").step("a", lambda: None))
    ids = [engine.start("order", {}).id for _ in range(3)]
    for index, run_id in enumerate(ids[:2]):  # held 100 s, then 40 s ago
        saga_clock.advance(60 if index else 0)
        with engine.db.transaction() as connection:
            connection.execute(
                update(executions)
                .where(executions.c.id == run_id)
                .values(state=ExecutionState.HELD.value, updated_at=to_db_time(saga_clock.now()))
            )
    saga_clock.advance(40)
    gauges = StoreGauges(engine.db)
    gauges.refresh()
    found = _scraped(gauges)
    assert value(found, "saga_runs", saga="order", state="held") == 2
    assert value(found, "saga_runs", saga="order", state="running") == 1
    assert value(found, "saga_oldest_held_run_age_seconds", saga="order") == 100
