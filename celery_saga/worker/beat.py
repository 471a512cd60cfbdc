"""The beat entries the extension installs.

``celery-saga-fire-timers`` (every ``saga_timer_interval`` s, default 5) fails runs whose
``wait_for`` deadline passed; ``celery-saga-recover`` (``saga_recover_interval``, 15)
republishes what lost messages left unfinished; ``celery-saga-cleanup`` and
``celery-saga-archive`` (``saga_cleanup_interval`` / ``saga_archive_interval``, 3600) remove
or archive terminal runs older than ``saga_cleanup_after`` / ``saga_archive_after`` seconds,
and are installed only when that retention is set. An entry of the same name already in
``beat_schedule`` is left as it is. (The sweep a starting worker requests is sent from
``celery_hooks``.)
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from celery_saga.worker.publisher import (
    ARCHIVE_TASK,
    CLEANUP_TASK,
    FIRE_TIMERS_TASK,
    RECOVER_TASK,
)

#: ``saga_cleanup_interval`` / ``saga_archive_interval`` when unset, in seconds.
RETENTION_INTERVAL = 3600.0


def _seconds(app: Celery, setting: str, default: float | None) -> float | None:
    value = app.conf.get(setting)
    return default if value is None else float(value)


def retention_interval(app: Celery, setting: str) -> float:
    """How often beat sends a retention task (``setting``: its interval setting)."""
    value = app.conf.get(setting)
    return RETENTION_INTERVAL if value is None else float(value)


def install_beat_entries(app: Celery) -> None:
    entries: dict[str, tuple[str, float | None]] = {
        "celery-saga-fire-timers": (FIRE_TIMERS_TASK, _seconds(app, "saga_timer_interval", 5.0)),
        "celery-saga-recover": (RECOVER_TASK, _seconds(app, "saga_recover_interval", 15.0)),
    }
    if app.conf.get("saga_cleanup_after") is not None:
        cleanup = retention_interval(app, "saga_cleanup_interval")
        entries["celery-saga-cleanup"] = (CLEANUP_TASK, cleanup)
    if app.conf.get("saga_archive_after") is not None:
        archive = retention_interval(app, "saga_archive_interval")
        entries["celery-saga-archive"] = (ARCHIVE_TASK, archive)
    schedule = dict(app.conf.beat_schedule or {})
    queue = app.conf.get("saga_queue")
    for name, (task, interval) in entries.items():
        entry: dict[str, Any] = {"task": task, "schedule": interval}
        if queue:
            entry["options"] = {"queue": queue}
        schedule.setdefault(name, entry)
    app.conf.beat_schedule = schedule
