"""How a saga message's Celery task ends: the one mapping from what the engine did with the
message (an ``Outcome``, already recorded) to Celery's ending.

Both entry points, the engine's own tasks (``worker/tasks.py``) and a step's own task
(``worker/step_run.py``), end here, so Celery's states, signals, hooks, events and result
backend see the truth:

- ``Ran`` / ``TakenOver``: SUCCESS with the result, as a plain call would return it.
- ``Retrying``: RETRY (same task id) when the engine or ``self.retry()`` asked for it; when
  the body raised, FAILURE with the body's own exception (``task_failure``, ``on_failure``),
  even though the step's ``retry=`` runs it again as a new task.
- ``Failed``: FAILURE with the body's own exception, else ``StepFailed`` (declared in the
  engine tasks' ``throws``, so Celery logs it as one INFO line: the engine already logged
  the error with its traceback; with ``acks_late`` the message is acknowledged as on
  success).
- ``NoBody``: a step's own task is ignored (no success hook or result claims a run that did
  not happen); an engine task returns.
- ``Stopped``: ignored, sending nothing: the cancel's revoke stopped the body, and the
  worker that stopped it announced the task REVOKED (``task-revoked``, ``task_revoked``,
  the result backend), as for any terminated task. Flower ranks SUCCESS and FAILURE above
  REVOKED, so any ending sent now would hide it.
- ``Interrupted``: the worker's own shutdown goes on (its ``SystemExit`` is raised again), so
  the pool accounts for the job as lost, never as failed or succeeded.
"""

from __future__ import annotations

from typing import Any

from celery.exceptions import Ignore, Retry

from celery_saga.errors import SagaError, StepRetryRequested
from celery_saga.runtime.moves import unreachable
from celery_saga.runtime.outcomes import (
    Failed,
    Interrupted,
    NoBody,
    Outcome,
    Ran,
    Retrying,
    Stopped,
    TakenOver,
)


class StepFailed(SagaError):
    """A step or reversal failed definitively; its outcome is already recorded."""


def end_task(task: Any, outcome: Outcome, *, own_body: bool, send_events: bool) -> Any:
    """Return or raise what ends ``task`` the way ``outcome`` says (``own_body``: the task
    is the step's own, whose body the message was meant to run)."""
    match outcome:
        case Ran(result=result) | TakenOver(result=result):
            return result
        case NoBody():
            if own_body:
                _ran_nothing(task, send_events)
            return None
        case Stopped():
            raise Ignore()
        case Retrying(description, countdown, error):
            if error is None or isinstance(error, StepRetryRequested):
                cause = error.cause if error is not None else None
                raise Retry(description, exc=cause, when=countdown)
            raise _failure(task, description, error)
        case Failed(description, error):
            raise _failure(task, description, error)
        case Interrupted(description, error):
            # The pool accounts for a job as lost only when SystemExit reaches it; a body's
            # cleanup may have turned it into another error, which Celery would call FAILURE.
            raise error if isinstance(error, SystemExit) else SystemExit(description) from error
        case _:
            unreachable(outcome)


def _failure(task: Any, description: str, error: BaseException | None) -> BaseException:
    """The exception a failed attempt's task ends with: the body's own, as for a plain call."""
    cause = error.cause if isinstance(error, StepRetryRequested) else error
    if isinstance(error, StepRetryRequested) and cause is None:
        return task.MaxRetriesExceededError(  # type: ignore[no-any-return]
            f"{description} (max_retries={error.max_retries})"
        )
    if isinstance(cause, Exception):
        return _from_user_code(cause)
    return StepFailed(description)


def _ran_nothing(task: Any, send_events: bool) -> None:
    """A duplicate, a held redelivery, a loop that ended: Celery is told the message was
    ignored (``before_start`` and ``task_prerun`` came before anyone could know). Monitors
    are sent ``task-succeeded`` with no result, as Celery's own duplicate detection
    (``worker_deduplicate_successful_tasks``) leaves them, not a task left STARTED."""
    if send_events:
        task.send_event("task-succeeded", result="None", runtime=0.0)
    raise Ignore()


def _from_user_code(error: BaseException) -> BaseException:
    """The body's exception with the engine's frames between this task and the user's code
    left out of its traceback, which then reads as a plain task's failure does. (Celery
    copies and formats every frame of it, for its log, ``task_failure``, the result backend
    and Flower: the engine's seven frames cost a failing task about 1 ms of its 8 ms of
    CPU.) An exception raised by the engine itself keeps its whole traceback."""
    tb = error.__traceback__
    while tb is not None and _engine_frame(tb.tb_frame):
        tb = tb.tb_next
    return error if tb is None else error.with_traceback(tb)


def as_raised_by_user_code(error: BaseException) -> BaseException:
    """``error`` as a step task's wrapper re-raises it. When it is the body's own exception,
    raised by ``end_task``, the engine frames from the wrapper down to the user's code are
    left out, so the traceback reads: Celery's tracer, the wrapper, the user's code (each
    frame the exception passes on its way out would come back otherwise). Anything else,
    the engine's own errors included, is returned unchanged."""
    tb, last = error.__traceback__, None
    while tb is not None and _engine_frame(tb.tb_frame):
        last, tb = tb.tb_frame.f_code, tb.tb_next
    if tb is None or last is not end_task.__code__:
        return error
    return error.with_traceback(tb)


def let_traceback_go(error: BaseException) -> None:
    """Drop the tracebacks of ``error`` and of the exceptions it was raised from, once its
    task has ended (``task_postrun``: Celery has logged, signalled, stored and copied it).
    Celery's tracer keeps the task's ``ExceptionInfo`` in its own frame, which that
    traceback holds: a cycle that only a full garbage collection frees, rare in a pool
    process, so each failed attempt kept its frames, request and message and the pool
    processes grew (tests/test_failure_memory.py)."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is not None and id(current) not in seen:
            seen.add(id(current))
            current.__traceback__ = None
            pending += (current.__cause__, current.__context__)


def _engine_frame(frame: Any) -> bool:
    return str(frame.f_globals.get("__name__", "")).startswith("celery_saga.")
