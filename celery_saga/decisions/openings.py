"""Which event says a worker took a run's first node: where ``saga_runs_started`` counts
a run, so a worker's exporter shows the runs that producers (web processes, without an
exporter) started.

Each is the event of a conditional write that succeeds once per run, whatever the
duplicates and redeliveries: ``saga-step-started`` with attempt 1 of the first step (or
of a first sub-saga node's record: the parent's claim of it); at a first gate,
``saga-waiting`` when the run parks there, or ``saga-resumed`` on arrival when its signal
came first; at a first loop or ``for_each`` that runs no iteration, ``saga-node-passed``
at its position 0.
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
    """What a run of a saga does first: the records its first claim may take (one per
    path of a first branch), or the event of the gate it opens at; and the node's index
    if it may run nothing at all."""

    records: frozenset[str] = frozenset()
    gate: str | None = None
    passed_at: int | None = None


def opening(nodes: Sequence[Node]) -> Opening:
    """The opening of a saga whose graph is ``nodes``."""
    first = first_position(nodes).node
    node = nodes[first]
    match node:
        case StepNode(step=spec):
            return Opening(frozenset({spec.name}))
        case ParallelNode(steps=members):
            return Opening(frozenset({members[0].name}))  # member 0: one count per run
        case BranchNode(paths=paths):
            return Opening(frozenset(path[0].name for path in paths.values() if path))
        case LoopNode(steps=body):
            iteration, index = loop_position(0, len(body))
            return Opening(
                frozenset({iteration_name(body[index].name, iteration)}), passed_at=first
            )
        case ForEachNode(step=spec):
            return Opening(frozenset({iteration_name(spec.name, 0)}), passed_at=first)
        case WaitNode(event=event):
            return Opening(gate=event)
        case SubSagaNode(name=name):
            return Opening(frozenset({name}))
    return Opening()


def opens_run(openings: Iterable[Opening], event: str, fields: Mapping[str, Any]) -> bool:
    """Does ``event`` say a worker took the first node of a run with one of ``openings``
    (those of every version of its saga this process knows)?"""
    if event == "saga-step-started":
        step = fields.get("step")
        return fields.get("attempt") == 1 and any(step in o.records for o in openings)
    if event == "saga-waiting" or (event == "saga-resumed" and fields.get("on_arrival")):
        return any(fields.get("event") == o.gate for o in openings if o.gate is not None)
    if event == "saga-node-passed" and fields.get("sub") == 0:
        return any(fields.get("node") == o.passed_at for o in openings if o.passed_at is not None)
    return False
