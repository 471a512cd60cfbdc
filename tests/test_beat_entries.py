"""The beat entries the extension installs, with their configurable intervals (issue 3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from celery import Celery

from celery_saga import ExecutionState, Saga, SagaEngine
from celery_saga.decisions.admission import NodeMessage
from celery_saga.worker.publisher import (
    ARCHIVE_TASK,
    CLEANUP_TASK,
    FIRE_TIMERS_TASK,
    RECOVER_TASK,
)
from tests.conftest import unconsumed_app


def _app(tmp_path: Path, **conf: Any) -> tuple[Celery, SagaEngine]:
    app = unconsumed_app("beat")
    app.conf.update(saga_store_url=f"sqlite:///{tmp_path}/beat.sqlite3", **conf)
    return app, SagaEngine(app)


def test_default_entries_fire_timers_and_recover_and_leave_data_alone(tmp_path: Path) -> None:
    app, _ = _app(tmp_path)
    schedule = app.conf.beat_schedule
    assert schedule["celery-saga-fire-timers"] == {"task": FIRE_TIMERS_TASK, "schedule": 5.0}
    assert schedule["celery-saga-recover"] == {"task": RECOVER_TASK, "schedule": 15.0}
    assert "celery-saga-cleanup" not in schedule, "nothing is deleted unless asked"
    assert "celery-saga-archive" not in schedule
    for task in (FIRE_TIMERS_TASK, RECOVER_TASK, CLEANUP_TASK, ARCHIVE_TASK):
        assert task in app.tasks


def test_intervals_retention_and_queue_are_configurable(tmp_path: Path) -> None:
    mine = {"task": "proj.tasks.nightly", "schedule": 60.0}
    app, _ = _app(
        tmp_path,
        saga_timer_interval=1,
        saga_recover_interval=7,
        saga_cleanup_after=86400,
        saga_cleanup_interval=600,
        saga_archive_after=3600,
        saga_queue="sagas",
        beat_schedule={"celery-saga-archive": mine},
    )
    schedule = app.conf.beat_schedule
    options = {"queue": "sagas"}
    assert schedule["celery-saga-fire-timers"] == {
        "task": FIRE_TIMERS_TASK,
        "schedule": 1.0,
        "options": options,
    }
    assert schedule["celery-saga-recover"]["schedule"] == 7.0
    assert schedule["celery-saga-cleanup"] == {
        "task": CLEANUP_TASK,
        "schedule": 600.0,
        "options": options,
    }
    assert schedule["celery-saga-archive"] == mine, "an entry of the app's own is kept"


def test_the_cleanup_task_applies_the_configured_retention(tmp_path: Path) -> None:
    app, engine = _app(tmp_path, saga_cleanup_after=0)
    engine.register(Saga("tiny").step("a", lambda: 1))
    engine.ensure_schema()
    run = engine.start("tiny")
    engine.executor.run_node(NodeMessage(run.id, 0, 0, 0, 1), "tiny")
    assert engine.get(run.id).state is ExecutionState.COMPLETED
    assert app.tasks[CLEANUP_TASK].apply().get() == 1
    assert engine.list(saga="tiny").items == ()
