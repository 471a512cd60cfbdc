"""The graph of sub-saga references across registered definitions (guarantee 29).

A saga that reaches itself through its sub-sagas would start children for ever, each run
waiting on the next; one that names a saga nobody registered would wedge at that node.
Both are refused before anything is stored: a cycle at ``register()``, a missing sub-saga
at ``start()`` (it may be registered later, by the same module or another).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from celery_saga.definition.builder import SagaDefinition
from celery_saga.errors import DefinitionError, UnknownSagaError

#: Looks a registered definition up by name (the engine's catalog).
Lookup = Callable[[str], SagaDefinition | None]


def _trails(find: Lookup, origin: str) -> list[tuple[str, ...]]:
    """Every saga reachable from ``origin`` through sub-sagas, each once, with the trail
    of names that leads to it (``origin`` first), in a stable order."""
    found: list[tuple[str, ...]] = []
    seen: set[str] = set()
    stack: list[tuple[str, ...]] = [(origin,)]
    while stack:
        trail = stack.pop()
        definition = find(trail[-1])
        children = () if definition is None else sorted(definition.child_sagas, reverse=True)
        for child in children:
            if child not in seen:
                seen.add(child)
                found.append((*trail, child))
                stack.append((*trail, child))
    return found


def check_no_cycle(lookup: Lookup, new: Sequence[SagaDefinition]) -> None:
    """Refuse ``new`` (about to be registered beside what ``lookup`` knows) if any of them
    reaches itself through sub-sagas. Registered definitions were checked when they came,
    so a new cycle passes through one of ``new``."""
    pending = {definition.name: definition for definition in new}

    def find(name: str) -> SagaDefinition | None:
        return pending.get(name) or lookup(name)

    for definition in new:
        for trail in _trails(find, definition.name):
            if trail[-1] == definition.name:
                raise DefinitionError(
                    f"saga {definition.name!r} runs itself through its sub-sagas "
                    f"({' -> '.join(trail)}): each run would start another for ever; "
                    "nothing was registered"
                )


def check_sub_sagas_known(lookup: Lookup, definition: SagaDefinition) -> None:
    """Refuse to start ``definition`` while a sub-saga it may run (directly or through its
    children) is not registered here: the run would stop at that node for good."""
    for trail in _trails(lookup, definition.name):
        if lookup(trail[-1]) is None:
            via = f" (via {' -> '.join(trail)})" if len(trail) > 2 else ""
            raise UnknownSagaError(
                f"saga {definition.name!r} cannot start: its sub-saga {trail[-1]!r}{via} is "
                "not registered in this process; register every saga it runs first. "
                "Nothing was stored"
            )
