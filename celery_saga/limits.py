"""What the store's bounded text columns can hold, checked before anything is written.

A value that no column can store (too long, a NUL character PostgreSQL refuses, text that is
not valid UTF-8) is refused with a ``SagaError`` naming the limit, instead of a driver error
half-way through a write, or a name that one backend stores and another cannot.
``test_the_limits_are_the_store_columns`` holds these numbers to ``store/tables.py``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from celery_saga.errors import ExecutionNotFoundError, SagaError

#: ``saga_executions.id`` (and every column naming an execution).
EXECUTION_ID_LENGTH = 64
#: ``saga_executions.saga_name``, ``saga_steps.name`` (record names, loop iterations
#: included) and ``saga_signals.event``.
NAME_LENGTH = 200

_LABEL_KEY = re.compile(r"[A-Za-z0-9_.-]+")


def text_problem(value: object, length: int, column: str = "its column") -> str | None:
    """Why ``value`` cannot be stored in ``column``, of ``length`` characters, or None."""
    if not isinstance(value, str):
        return f"is of type {type(value).__name__}, not str"
    if len(value) > length:
        return f"is {len(value)} characters long; {column} holds at most {length}"
    if "\x00" in value:
        return "contains a NUL character, which PostgreSQL cannot store"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid text (it holds a lone surrogate, which cannot be encoded)"
    return None


def check_lookup_id(execution_id: object) -> None:
    """A value no stored id can equal is simply not found, and no query is sent for it
    (drivers raise their own errors for some: PostgreSQL for a NUL or a non-str)."""
    problem = text_problem(execution_id, EXECUTION_ID_LENGTH, "saga_executions.id")
    if problem is not None:
        raise ExecutionNotFoundError(
            f"no saga execution with id {execution_id!r:.100}: an execution id {problem}"
        )


def check_new_execution_id(execution_id: object) -> None:
    """A caller-chosen id for ``start``: 1-64 characters, storable, without ':'."""
    if execution_id is None:
        return
    problem = text_problem(execution_id, EXECUTION_ID_LENGTH, "saga_executions.id")
    if problem is None and isinstance(execution_id, str):
        # No colon: it leads every idempotency key, which must parse unambiguously.
        if not execution_id:
            problem = "is empty"
        elif ":" in execution_id:
            problem = "contains ':'"
    if problem is not None:
        raise SagaError(
            "execution_id must be a string of 1-64 characters without ':', "
            f"got {execution_id!r:.100}: it {problem}"
        )


def listed_saga_names(saga: object) -> list[str]:
    """The ``saga`` filter of ``list()``: one name or an iterable of names, each storable
    (a name no run can carry would reach the driver as an error, not as no rows)."""
    if saga is None:
        return []
    if isinstance(saga, str) or not isinstance(saga, Iterable):
        names: list[object] = [saga]
    else:
        names = list(saga)
    for name in names:
        problem = text_problem(name, NAME_LENGTH, "saga_executions.saga_name")
        if problem is not None:
            raise SagaError(f"list(saga=...): the saga name {name!r:.100} {problem}")
    return [str(name) for name in names]


def storable_cursor_id(execution_id: str) -> str:
    """The execution id a decoded ``list()`` cursor names; ValueError if no run has it."""
    if text_problem(execution_id, EXECUTION_ID_LENGTH) is not None:
        raise ValueError(execution_id)
    return execution_id


#: ``saga_run_labels.key`` and ``.value``, and how many labels one run may carry.
LABEL_KEY_LENGTH = 100
LABEL_VALUE_LENGTH = 200
MOST_LABELS = 20


def checked_labels(labels: object) -> dict[str, str]:
    """A run's labels as given to ``start``: a mapping of at most ``MOST_LABELS`` text keys
    (1-100 characters of letters, digits, ``_ - .``) to text values (at most 200
    characters); a ``SagaError`` naming the first label that is not."""
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise SagaError(f"labels must be a mapping of text to text, got {type(labels).__name__}")
    if len(labels) > MOST_LABELS:
        raise SagaError(f"a run carries at most {MOST_LABELS} labels, got {len(labels)}")
    for key, value in labels.items():
        problem = text_problem(key, LABEL_KEY_LENGTH, "saga_run_labels.key")
        if problem is None and not _LABEL_KEY.fullmatch(key):
            problem = "is not 1 or more letters, digits, '_', '-' or '.'"
        if problem is not None:
            raise SagaError(f"the label key {key!r:.100} {problem}")
        problem = text_problem(value, LABEL_VALUE_LENGTH, "saga_run_labels.value")
        if problem is not None:
            raise SagaError(f"the value of label {key!r} {problem}")
    return dict(labels)
