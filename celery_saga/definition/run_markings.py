"""The markings a run's data is shown and scrubbed by, decided here for every view (``saga
show``, the web view, the Django admin) and for the failure texts the engine writes.

A run is marked by its saga's ``sensitive=`` (``sensitivity.py``), and by each sub-saga's
own at the record of that sub-saga: the parent's record of a child holds the child's
results (``{step: result}``), which the parent's markings know nothing of. A saga this
process does not have (a view started with another service's app, a deploy not yet
everywhere) has markings it cannot know: all of its data is marked, fail closed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import SubSagaNode
from celery_saga.definition.sensitivity import Sensitivity

#: The version (saga name, hash) of a saga, or its newest version when the hash is None.
FindDefinition = Callable[[str, "str | None"], "SagaDefinition | None"]
#: The markings of a saga this process does not have: everything.
UNREGISTERED = Sensitivity(unregistered=True)


def run_markings(find: FindDefinition, saga: str, definition_hash: str | None) -> Sensitivity:
    """The markings of a run of version ``definition_hash`` of ``saga``: that version's,
    else its saga's newest (markings are not part of a version's identity), else
    ``UNREGISTERED``."""
    definition = find(saga, definition_hash) if definition_hash else None
    return markings_of(find, definition or find(saga, None))


def markings_of(
    find: FindDefinition, definition: SagaDefinition | None, within: frozenset[str] = frozenset()
) -> Sensitivity:
    """``definition``'s markings with its sub-sagas' (their newest versions') at their
    records, and theirs within them; ``UNREGISTERED`` for a missing saga. ``within``: the
    sagas already on the way down (a cycle, refused at ``register``, would not end)."""
    if definition is None or definition.name in within:
        return UNREGISTERED
    children = []
    for node in definition.nodes:
        if isinstance(node, SubSagaNode):
            marks = markings_of(find, find(node.saga, None), within | {definition.name})
            if not marks.empty:
                children.append((node.name, marks))
    own = definition.sensitive
    return replace(own, children=tuple(children)) if children else own
