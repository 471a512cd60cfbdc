"""The store's gauges (``celery_saga.gauges``): unfinished runs by saga and state and the age
of each saga's oldest unfinished run, read by a thread; a scrape serves the last reading and
``saga_store_up`` says whether the store answered."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from celery_saga import Saga, SagaEngine
from celery_saga.gauges import StoreGauges
from celery_saga.testing.clock import ControlledClock
from tests.conftest import unconsumed_app
from tests.test_metrics import samples, value


def _scraped(gauges: StoreGauges) -> dict:  # type: ignore[type-arg]
    registry = CollectorRegistry()
    registry.register(gauges)
    return samples(generate_latest(registry).decode())


def test_the_gauges_count_unfinished_runs_and_age_the_oldest(
    tmp_path: Path, saga_clock: ControlledClock
) -> None:
    engine = SagaEngine(unconsumed_app("gauges"), store_url=f"sqlite:///{tmp_path}/g.sqlite3")
    engine.register(Saga("order").step("a", lambda: None), Saga("refund").step("a", lambda: None))
    engine.start("order", {})  # no worker: they stay running
    saga_clock.advance(90)
    engine.start("order", {})
    engine.start("refund", {})
    saga_clock.advance(30)
    gauges = StoreGauges(engine.db)
    assert value(_scraped(gauges), "saga_store_up") == 0, "nothing read yet"

    gauges.refresh()
    found = _scraped(gauges)
    assert value(found, "saga_runs", saga="order", state="running") == 2
    assert value(found, "saga_runs", saga="refund", state="running") == 1
    assert value(found, "saga_oldest_unfinished_run_age_seconds", saga="order") == 120
    assert value(found, "saga_oldest_unfinished_run_age_seconds", saga="refund") == 30
    assert value(found, "saga_store_up") == 1


def test_a_store_that_cannot_be_read_keeps_the_last_reading_and_says_so(
    tmp_path: Path, saga_clock: ControlledClock
) -> None:
    engine = SagaEngine(unconsumed_app("gauges"), store_url=f"sqlite:///{tmp_path}/g.sqlite3")
    engine.register(Saga("order").step("a", lambda: None))
    engine.start("order", {})
    gauges = StoreGauges(engine.db)
    gauges.refresh()
    with engine.db.engine.begin() as connection:  # the store goes away
        connection.exec_driver_sql("ALTER TABLE saga_executions RENAME TO gone")
    gauges.refresh()
    found = _scraped(gauges)
    assert value(found, "saga_store_up") == 0
    assert value(found, "saga_runs", saga="order", state="running") == 1, "the last reading"


def test_the_gauges_count_paused_steps_and_the_runs_held_at_their_doors(tmp_path: Path) -> None:
    engine = SagaEngine(unconsumed_app("gauges"), store_url=f"sqlite:///{tmp_path}/g.sqlite3")
    engine.register(Saga("order").step("a", lambda: None).step("b", lambda: None))
    gauges = StoreGauges(engine.db)
    gauges.refresh()
    assert value(_scraped(gauges), "saga_paused_steps", saga="order") == 0
    engine.pause("order", "a", reason="provider down")
    engine.pause("order", reason="maintenance")
    gauges.refresh()
    found = _scraped(gauges)
    assert value(found, "saga_paused_steps", saga="order") == 2
    assert value(found, "saga_paused_held_runs", saga="order", step="a") == 0
    assert value(found, "saga_paused_held_runs", saga="order", step="*") == 0
    engine.unpause("order", "a")
    gauges.refresh()
    assert value(_scraped(gauges), "saga_paused_steps", saga="order") == 1
