"""The engine tasks every worker registers: run a node, run a reversal, carry out a call
handed on by a process without a run's version, and the sweeps."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery_saga.decisions.admission import NodeMessage
from celery_saga.errors import StoreConfigurationError, StoreUnavailableError
from celery_saga.runtime.outcomes import Outcome
from celery_saga.worker.delivery import STORE_RETRY_MAX, SendAgain, handle_message
from celery_saga.worker.endings import StepFailed, end_task
from celery_saga.worker.housekeeping import quiet_housekeeping_logs
from celery_saga.worker.parts import WorkerParts
from celery_saga.worker.publisher import (
    ARCHIVE_TASK,
    CLEANUP_TASK,
    COMMAND_TASK,
    COMPENSATE_TASK,
    FIRE_TIMERS_TASK,
    NODE_TASK,
    RECOVER_TASK,
)
from celery_saga.worker.run_commands import carry_out
from celery_saga.worker.saga_header import read_header, version_of
from celery_saga.worker.sweeps import Sweeps

logger = logging.getLogger("celery_saga")

#: Late ack + reject on worker loss: a SIGKILLed worker's message is redelivered, and
#: admission turns the redelivery into a resume instead of a second run. A store that
#: refused its URL is one line per message (its message says it all), no traceback.
_TASK_OPTIONS: dict[str, Any] = {
    "bind": True,
    "acks_late": True,
    "reject_on_worker_lost": True,
    "ignore_result": True,
    "shared": False,
    "throws": (StepFailed, StoreConfigurationError),
}
#: Sweeps: no task events (Flower's list), per-run log lines at DEBUG when idle.
_SWEEP_OPTIONS: dict[str, Any] = {"ignore_result": True, "shared": False, "send_events": False}


def register_tasks(parts: WorkerParts, sweeps: Sweeps) -> None:
    quiet_housekeeping_logs()
    _message_tasks(parts)
    _sweep_tasks(parts, sweeps)


def _message_tasks(parts: WorkerParts) -> None:
    """The tasks of a run's own messages: a node, a reversal, a handed-on command."""
    app, executor, events = parts.app, parts.executor, parts.events

    @app.task(name=NODE_TASK, **_TASK_OPTIONS)  # type: ignore[untyped-decorator]
    def saga_node(
        task: Any,
        execution_id: str,
        saga_name: str,
        node: int,
        sub: int,
        member: int,
        attempt: int,
    ) -> None:
        message = NodeMessage(execution_id, node, sub, member, attempt)
        outcome = handle_message(
            parts,
            task,
            task.request.retries or 0,
            _send_again(task),
            lambda redelivered: executor.run_node(
                message, saga_name, redelivered, version_of(read_header(task.request))
            ),
        )
        end_task(task, outcome, own_body=False, send_events=events.send_to_celery)

    @app.task(name=COMPENSATE_TASK, **_TASK_OPTIONS)  # type: ignore[untyped-decorator]
    def saga_compensate(task: Any, execution_id: str, step_name: str, attempt: int) -> None:
        outcome = handle_message(
            parts,
            task,
            task.request.retries or 0,
            _send_again(task),
            lambda redelivered: executor.unwinder.run(
                execution_id, step_name, attempt, redelivered, *_saga_and_version(task)
            ),
        )
        end_task(task, outcome, own_body=False, send_events=events.send_to_celery)

    @app.task(name=COMMAND_TASK, **_TASK_OPTIONS)  # type: ignore[untyped-decorator]
    def saga_command(task: Any, execution_id: str, command: str, arguments: Any) -> None:
        def here(redelivered: bool) -> Outcome:
            saga, version = _saga_and_version(task)
            if saga is not None and version is not None:  # not here: raises, handed back
                parts.catalog.for_run(saga, version, execution_id)
            return carry_out(parts, execution_id, command, dict(arguments or {}))

        outcome = handle_message(parts, task, task.request.retries or 0, _send_again(task), here)
        end_task(task, outcome, own_body=False, send_events=events.send_to_celery)


def _sweep_tasks(parts: WorkerParts, sweeps: Sweeps) -> None:
    """Beat's tasks, each skipped with one line when the store is out."""
    app = parts.app

    @app.task(name=RECOVER_TASK, **_SWEEP_OPTIONS)  # type: ignore[untyped-decorator]
    def saga_recover() -> int:
        return _skipped_in_an_outage("the recovery sweep", sweeps.recover)

    @app.task(name=FIRE_TIMERS_TASK, **_SWEEP_OPTIONS)  # type: ignore[untyped-decorator]
    def saga_fire_timers() -> int:
        return _skipped_in_an_outage("the timer sweep", sweeps.fire_timers)

    @app.task(name=CLEANUP_TASK, **_SWEEP_OPTIONS)  # type: ignore[untyped-decorator]
    def saga_cleanup() -> int:
        return _skipped_in_an_outage("the cleanup sweep", lambda: sweeps.retain(archive=False))

    @app.task(name=ARCHIVE_TASK, **_SWEEP_OPTIONS)  # type: ignore[untyped-decorator]
    def saga_archive() -> int:
        return _skipped_in_an_outage("the archive sweep", lambda: sweeps.retain(archive=True))


def _skipped_in_an_outage(what: str, sweep: Callable[[], int]) -> int:
    """Run a sweep; one that meets a store unreachable for its whole budget is skipped
    with one line (the next one, seconds later, does its work), not a failed task with a
    traceback every interval of an outage (guarantee 30's quiet logs). A store that refused
    its URL is one line too: its message names the fix (tests/test_store_url_errors.py)."""
    try:
        return sweep()
    except StoreUnavailableError:
        logger.warning("%s skipped: the saga store is unreachable; beat sends the next", what)
        return 0
    except StoreConfigurationError as refused:
        logger.error("%s skipped: %s", what, refused)
        return 0


def _saga_and_version(task: Any) -> tuple[str | None, str | None]:
    """The saga and version a compensate message names (None from an older release)."""
    header = read_header(task.request)
    return (str(header["saga"]) if header else None), version_of(header)


def _send_again(task: Any) -> SendAgain:
    """The engine's own tasks are sent again through Celery's retry (same task id)."""

    def send_again(countdown: int, error: Exception) -> BaseException:
        retried: BaseException = task.retry(
            countdown=countdown, max_retries=STORE_RETRY_MAX, exc=error
        )
        return retried  # not reached: Celery's retry raises its Retry itself

    return send_again
