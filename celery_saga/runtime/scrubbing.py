"""Failure texts without a run's sensitive values: what the engine stores, logs and emits
when a step, a reversal or a choice fails is scrubbed of every marked value of the run
(``redaction.py``) before it is written anywhere. A saga with no markings costs nothing
here: the run is read only when its saga marks something."""

from __future__ import annotations

import logging
import traceback
from typing import Any

from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.run_markings import FindDefinition, markings_of
from celery_saga.redaction import redact, run_secrets, scrub
from celery_saga.store import queries
from celery_saga.store.database import Database
from celery_saga.store.waits import load_signals


def failure_secrets(
    db: Database, definition: SagaDefinition, execution_id: str, find: FindDefinition
) -> frozenset[str]:
    """The text forms of the run's marked values: its input, every stored step result
    (a failed or reversed step's too, a sub-saga's by the child's markings, found with
    ``find``) and its signals' payloads."""
    marks = markings_of(find, definition)
    if marks.empty:
        return frozenset()
    execution, steps = queries.load_snapshot(db, execution_id)
    if execution is None:
        return frozenset()
    results = {s.name: s.result for s in steps if s.result is not None}
    signals = load_signals(db, execution_id) if definition.events else {}
    return run_secrets(marks, execution.input, results, signals)


def scrub_exception(error: BaseException, secrets: frozenset[str]) -> None:
    """Scrub the marked values out of the string arguments of ``error`` and of the
    exceptions it was raised from, in place: the step's task ends with this very exception,
    and Celery prints its message in its log line, ``task-failed`` (Flower) and the result
    backend. Its type, other attributes and traceback stay as they are; an exception whose
    text does not come from its arguments is not changed."""
    seen: set[int] = set()
    current: BaseException | None = error
    while secrets and current is not None and id(current) not in seen:
        seen.add(id(current))
        arguments = tuple(
            scrub(a, secrets) if isinstance(a, str) else a for a in getattr(current, "args", ())
        )
        if arguments != current.args:
            current.args = arguments
        current = current.__cause__ or current.__context__


def shown_result(definition: SagaDefinition, step: str, result: Any) -> Any:
    """What a step's task returns to Celery (its log line, ``task-succeeded``, the result
    backend): the stored result with its marked parts redacted."""
    return redact(result, ("results", step), definition.sensitive)


def log_failure(
    logger: logging.Logger,
    level: int,
    message: str,
    *args: Any,
    error: BaseException | None,
    secrets: frozenset[str],
) -> None:
    """Log a failure with ``error``'s traceback (None: without one). A traceback that shows a
    marked value is logged as scrubbed text instead: a log handler formats ``exc_info``
    itself, past any scrubbing."""
    if error is None or not secrets:
        logger.log(level, message, *args, exc_info=error)
        return
    text = "".join(traceback.format_exception(error)).rstrip()
    scrubbed = scrub(text, secrets)
    if scrubbed == text:
        logger.log(level, message, *args, exc_info=error)
    else:
        logger.log(level, message + "\n%s", *args, scrubbed)
