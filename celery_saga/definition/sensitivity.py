"""Which parts of a run's data are sensitive: the ``sensitive=`` markings of a saga and of
its steps, checked when the saga is built. They say what humans must not be shown (logs,
failure reasons, ``celery saga show``, Celery's task results); they do not change the graph,
so they stay out of the structural hash."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from celery_saga.definition.nodes import split_iteration
from celery_saga.errors import DefinitionError

#: Where a value sits in a run: ``("input", ...)``, ``("results", step, ...)`` or
#: ``("signals", event, ...)``, then dict keys and list indexes.
DataPath = tuple[str | int, ...]
#: ``sensitive=callable``: called with each value's path and the value, True marks it.
Predicate = Callable[[DataPath, Any], bool]


@dataclass(frozen=True)
class Sensitivity:
    """The markings of one saga: dict ``keys`` marked at any depth, a ``predicate`` over
    (path, value), and ``steps`` whose whole result is marked (a loop body step's every
    iteration with it).

    A run is shown by its saga's markings with two more (``run_markings.py``): ``children``,
    the markings of each sub-saga by its record name here, apply to that record's result
    (the child's ``{step: result}``) as they apply to the child's own run; ``unregistered``
    marks everything, for a saga whose markings this process cannot know."""

    keys: frozenset[str] = frozenset()
    predicate: Predicate | None = None
    steps: frozenset[str] = frozenset()
    children: tuple[tuple[str, Sensitivity], ...] = ()
    unregistered: bool = False

    @property
    def empty(self) -> bool:
        return not (self.keys or self.predicate or self.steps or self.children) and (
            not self.unregistered
        )

    def marked(self, path: DataPath, value: Any) -> bool:
        """Whether the value at ``path`` is sensitive. A predicate that raises marks the
        value: a broken rule must not show what it was written to hide."""
        if self.unregistered:
            return True
        child, within = self._child(path)
        if child is not None and (
            child.unregistered or (len(path) > 2 and child.marked(within, value))
        ):
            return True
        step = path[1] if len(path) == 2 and path[0] == "results" else None
        if isinstance(step, str) and split_iteration(step)[0] in self.steps:
            return True
        # A key of the input starts at its second element; of a result or a payload, after
        # the step or event name (a step named like a marked key is not marked by it).
        first_key = 1 if path[:1] == ("input",) else 2
        if len(path) > first_key and isinstance(path[-1], str) and path[-1] in self.keys:
            return True
        if self.predicate is None:
            return False
        try:
            return bool(self.predicate(path, value))
        except Exception:
            return True

    def unknown(self, path: DataPath) -> bool:
        """Whether ``path`` is marked for want of its saga's markings (``unregistered``)."""
        if self.unregistered:
            return True
        child, within = self._child(path)
        return child is not None and child.unknown(within)

    def _child(self, path: DataPath) -> tuple[Sensitivity | None, DataPath]:
        """The markings of the sub-saga whose record ``path`` is in, and the path in the
        child's own run that ``path`` names: ``("results", record, step, ...)`` is the
        child's ``("results", step, ...)``."""
        if not self.children or len(path) < 2 or path[0] != "results":
            return None, path
        found = next((marks for record, marks in self.children if record == path[1]), None)
        return found, ("results", *path[2:])


def saga_sensitivity(saga: str, sensitive: Any) -> Sensitivity:
    """``Saga(..., sensitive=)`` checked: None, a callable ``(path, value) -> bool``, or an
    iterable of dict key names (a single string is refused: it would read as its letters)."""
    if sensitive is None:
        return Sensitivity()
    if callable(sensitive):
        return Sensitivity(predicate=sensitive)
    if isinstance(sensitive, (str, bytes)) or not isinstance(sensitive, Iterable):
        raise DefinitionError(
            f"saga {saga!r}: sensitive= takes key names as a tuple or list (e.g. "
            f"sensitive=('card',)) or a callable (path, value) -> bool, got {sensitive!r}"
        )
    keys = tuple(sensitive)
    for key in keys:
        if not isinstance(key, str) or not key:
            raise DefinitionError(
                f"saga {saga!r}: sensitive= names dict keys as non-empty strings, got {key!r}"
            )
    return Sensitivity(keys=frozenset(keys))


def check_step_sensitive(saga: str, step: str, sensitive: Any) -> None:
    """``step(..., sensitive=)`` is True (the step's whole result is marked) or False."""
    if not isinstance(sensitive, bool):
        raise DefinitionError(
            f"saga {saga!r}: step {step!r} takes sensitive=True or False (its whole result), "
            f"got {sensitive!r}; mark keys on the saga: Saga(name, sensitive=('key',))"
        )
