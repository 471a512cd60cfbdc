"""Housekeeping tasks stay out of the way: no task events (so not in Flower's list), and
their per-run log lines at DEBUG unless a sweep actually did something.

Beat sends the timer sweep every 5 s and recovery every 15 s; at INFO Celery would log two
lines for each in the worker (received, succeeded), over a thousand an hour saying nothing,
and beat one more ("Sending due task", 16 a minute). Celery's beat has no setting for an
entry's log line (``Scheduler.apply_entry`` logs it at INFO on the ``celery.beat`` logger),
so the same filter demotes it there too.
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
#: The loggers of Celery's "Task ... received" and "Task ... succeeded" lines, and of
#: beat's "Sending due task" line.
_LOGGERS = ("celery.worker.strategy", "celery.app.trace", "celery.beat")
#: Beat's line for each entry it sends (celery/beat.py, ``Scheduler.apply_entry``): its
#: arguments are the entry's name and its task's.
_BEAT_SENDING = "Scheduler: Sending due task %s (%s)"


class QuietHousekeeping(logging.Filter):
    """Demote the received line and beat's sending line always, the succeeded line when
    the sweep returned 0."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _housekeeping_sent(record) or _idle_or_received(record):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def _idle_or_received(record: logging.LogRecord) -> bool:
    context = record.args
    if not isinstance(context, dict) or context.get("name") not in HOUSEKEEPING_TASKS:
        return False
    idle = record.msg == trace.LOG_SUCCESS and str(context.get("return_value")) == "0"
    return record.msg == trace.LOG_RECEIVED or idle


def _housekeeping_sent(record: logging.LogRecord) -> bool:
    sent = record.args
    return (
        record.msg == _BEAT_SENDING
        and isinstance(sent, tuple)
        and len(sent) == 2
        and sent[1] in HOUSEKEEPING_TASKS
    )


def quiet_housekeeping_logs() -> None:
    """Install the filter once per process."""
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, QuietHousekeeping) for f in logger.filters):
            logger.addFilter(QuietHousekeeping())
