"""Housekeeping tasks stay out of the way: no task events (so not in Flower's list), and
their per-run log lines at DEBUG unless a sweep actually did something.

Beat sends the timer sweep every 5 s and recovery every 30 s; at INFO Celery would log two
lines for each (received, succeeded), over a thousand an hour saying nothing.
"""

from __future__ import annotations

import logging

from celery.app import trace

from celery_saga.worker.publisher import (
    ARCHIVE_TASK,
    CLEANUP_TASK,
    FIRE_TIMERS_TASK,
    RECOVER_TASK,
)

HOUSEKEEPING_TASKS = frozenset({FIRE_TIMERS_TASK, RECOVER_TASK, CLEANUP_TASK, ARCHIVE_TASK})
#: The loggers of Celery's "Task ... received" and "Task ... succeeded" lines.
_LOGGERS = ("celery.worker.strategy", "celery.app.trace")


class QuietHousekeeping(logging.Filter):
    """Demote the received line always, the succeeded line when the sweep returned 0."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = record.args
        if not isinstance(context, dict) or context.get("name") not in HOUSEKEEPING_TASKS:
            return True
        idle = record.msg == trace.LOG_SUCCESS and str(context.get("return_value")) == "0"
        if record.msg == trace.LOG_RECEIVED or idle:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def quiet_housekeeping_logs() -> None:
    """Install the filter once per process."""
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, QuietHousekeeping) for f in logger.filters):
            logger.addFilter(QuietHousekeeping())
