"""Which event says a worker took a run's first node: where ``saga_runs_started`` counts
a run, so a worker's exporter shows the runs that producers (web processes, without an
exporter) started.

Each is the event of a conditional write that succeeds once per run, whatever the
duplicates and redeliveries: ``saga-step-started`` with attempt 1 of the first step (or
of a first sub-saga node's record: the parent's claim of it); at a first gate,
``saga-waiting`` when the run parks there, or ``saga-resumed`` on arrival when its signal
came first; at a first loop or ``for_each`` that runs no iteration, ``saga-node-passed``
at its position 0; and ``saga-forward-failed`` at that position when the run failed there
for a reason no step raised (a loop's condition, a ``for_each``'s items, a sub-saga's
input), before anything ran.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from celery_saga.decisions.cursor import first_position
from celery_saga.decisions.loops import loop_position
from celery_saga.definition.nodes import (
    BranchNode,
    ForEachNode,
    LoopNode,
    Node,
    ParallelNode,
    StepNode,
    SubSagaNode,
    WaitNode,
    iteration_name,
)


@dataclass(frozen=True)
class Opening:
    """What a run of a saga (of ``version``, when known) does first: the records its first
    claim may take (one per path of a first branch), or the event of the gate it opens at;
    ``first``: the first node's index; ``may_pass``: whether that node may run nothing at
    all (a loop or ``for_each``)."""

    records: frozenset[str] = frozenset()
    gate: str | None = None
    first: int = 0
    may_pass: bool = False
    version: str | None = None


def opening(nodes: Sequence[Node], version: str | None = None) -> Opening:
    """The opening of a saga whose graph is ``nodes``."""
    first = first_position(nodes).node
    records, gate, may_pass = _what_runs_first(nodes[first])
    return Opening(records, gate, first, may_pass, version)


def _what_runs_first(node: Node) -> tuple[frozenset[str], str | None, bool]:
    """The records a first node's claim may take, its gate, whether it may run nothing."""
    match node:
        case StepNode(step=spec):
            return frozenset({spec.name}), None, False
        case ParallelNode(steps=members):
            return frozenset({members[0].name}), None, False  # member 0: one count per run
        case BranchNode(paths=paths):
            return frozenset(path[0].name for path in paths.values() if path), None, False
        case LoopNode(steps=body):
            iteration, index = loop_position(0, len(body))
            return frozenset({iteration_name(body[index].name, iteration)}), None, True
        case ForEachNode(step=spec):
            return frozenset({iteration_name(spec.name, 0)}), None, True
        case WaitNode(event=event):
            return frozenset(), event, False
        case SubSagaNode(name=name):
            return frozenset({name}), None, False
    return frozenset(), None, False


def opens_run(openings: Iterable[Opening], event: str, fields: Mapping[str, Any]) -> bool:
    """Does ``event`` say a worker took the first node of a run with one of ``openings``
    (those of every version of its saga this process knows)? An event that names its
    run's version is matched against that version's opening alone."""
    if "version" in fields:
        openings = [o for o in openings if o.version in (None, fields["version"])]
    if event == "saga-step-started":
        step = fields.get("step")
        return fields.get("attempt") == 1 and any(step in o.records for o in openings)
    if event == "saga-waiting" or (event == "saga-resumed" and fields.get("on_arrival")):
        return any(fields.get("event") == o.gate for o in openings if o.gate is not None)
    if fields.get("sub") != 0:
        return False
    if event == "saga-node-passed":
        return any(fields.get("node") == o.first for o in openings if o.may_pass)
    # a failure no step raised (a choice, a sub-saga's input) before anything ran
    return event == "saga-forward-failed" and any(fields.get("node") == o.first for o in openings)
