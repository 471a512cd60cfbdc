"""Which runs an operator means: ``--where`` terms parsed into one ``RunFilter``.

Terms, each ``KEY=VALUE`` (``error~TEXT`` for a substring): ``saga=``, ``version=`` (a hash,
its first characters, or a version label), ``state=``, ``step=`` (the run's current or
failed step), ``error~`` (text of its failure or of a step's error), ``older=`` (age, as
``1h`` or ``7d``), ``label.KEY=`` (a label given at start). Repeating ``saga``,
``version``, ``state`` or ``step`` means any of the values; every other term must hold
too. Parsing is pure: the store's query builder (``store.run_selection``) reads the value.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from celery_saga.durations import parse_duration
from celery_saga.errors import SagaError
from celery_saga.limits import NAME_LENGTH, checked_labels, text_problem
from celery_saga.records import ExecutionState

#: The keys a term may have, as an operator is told when a term has another one.
KEYS = ("saga", "version", "state", "step", "error~", "older", "label.KEY")


class FilterError(SagaError):
    """A ``--where`` term that cannot be read; the message names the term."""


@dataclass(frozen=True)
class RunFilter:
    """Runs that match every part given (an empty part matches every run)."""

    sagas: tuple[str, ...] = ()
    versions: tuple[str, ...] = ()
    states: tuple[ExecutionState, ...] = ()
    steps: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    older_than: timedelta | None = None
    labels: tuple[tuple[str, str], ...] = ()
    #: The terms as given, in order: what the operation stores and prints.
    terms: tuple[str, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.terms

    def text(self) -> str:
        """The terms as stored with a bulk operation (``parse_where`` reads it back)."""
        return json.dumps(list(self.terms))


def _split(term: str) -> tuple[str, str, str]:
    """(key, operator, value) of one term."""
    equals, tilde = term.find("="), term.find("~")
    cuts = [i for i in (equals, tilde) if i > 0]
    if not cuts:
        raise FilterError(
            f"--where {term!r:.100}: expected KEY=VALUE (or error~TEXT); keys: {', '.join(KEYS)}"
        )
    cut = min(cuts)
    return term[:cut].strip(), term[cut], term[cut + 1 :]


def _name(term: str, value: str, what: str) -> str:
    problem = "is empty" if not value else text_problem(value, NAME_LENGTH, what)
    if problem is not None:
        raise FilterError(f"--where {term!r:.100}: the value {problem}")
    return value


def parse_where(terms: Iterable[str]) -> RunFilter:
    """The filter ``terms`` name; ``FilterError`` naming the first term that is not one."""
    parts: dict[str, list[str]] = {"saga": [], "version": [], "step": [], "error": []}
    states: list[ExecutionState] = []
    labels: dict[str, str] = {}
    older: timedelta | None = None
    given = list(terms)
    for term in given:
        if not isinstance(term, str):
            raise FilterError(f"a --where term is text, got {type(term).__name__}")
        key, operator, value = _split(term)
        if (key == "error") != (operator == "~"):
            raise FilterError(
                f"--where {term!r:.100}: use error~TEXT for the error, KEY=VALUE for the rest"
            )
        if key in ("saga", "version", "step"):
            parts[key].append(_name(term, value, key))
        elif key == "error":
            parts["error"].append(_name(term, value, "error text"))
        elif key == "state":
            states.append(_state(term, value))
        elif key == "older":
            if older is not None:
                raise FilterError(f"--where {term!r:.100}: give older= once")
            try:
                older = parse_duration(value)
            except SagaError as error:
                raise FilterError(f"--where {term!r:.100}: {error}") from None
        elif key.startswith("label."):
            label = key[len("label.") :]
            if label in labels:
                raise FilterError(f"--where {term!r:.100}: label {label!r} is given twice")
            try:
                labels.update(checked_labels({label: value}))
            except SagaError as error:
                raise FilterError(f"--where {term!r:.100}: {error}") from None
        else:
            raise FilterError(
                f"--where {term!r:.100}: unknown key {key!r:.40}; keys: {', '.join(KEYS)}"
            )
    return RunFilter(
        sagas=tuple(parts["saga"]),
        versions=tuple(parts["version"]),
        states=tuple(states),
        steps=tuple(parts["step"]),
        errors=tuple(parts["error"]),
        older_than=older,
        labels=tuple(sorted(labels.items())),
        terms=tuple(given),
    )


def _state(term: str, value: str) -> ExecutionState:
    try:
        return ExecutionState(value)
    except ValueError:
        allowed = ", ".join(s.value for s in ExecutionState)
        raise FilterError(
            f"--where {term!r:.100}: unknown state {value!r:.40}; expected one of: {allowed}"
        ) from None


def filter_from_text(text: str) -> RunFilter:
    """The filter a bulk operation stored (``RunFilter.text``)."""
    return parse_where(json.loads(text))
