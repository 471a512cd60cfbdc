"""Which event says a worker took a run's first node: where ``saga_runs_started`` counts
a run, so a worker's exporter shows the runs that producers (web processes, without an
exporter) started.

The first attempt's claim of the first step is taken once per run (the claim's WHERE
clause is the guarantee), so ``saga-step-started`` with attempt 1 of that step happens
once whatever the duplicates and redeliveries; a run that opens at a gate says
``saga-waiting`` once, when it parks there.
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
    WaitNode,
    iteration_name,
)


@dataclass(frozen=True)
class Opening:
    """What a run of a saga does first: the records its first claim may take (one per
    path of a first branch), or the event of the gate it opens at."""

    records: frozenset[str] = frozenset()
    gate: str | None = None


def opening(nodes: Sequence[Node]) -> Opening:
    """The opening of a saga whose graph is ``nodes``."""
    node = nodes[first_position(nodes).node]
    match node:
        case StepNode(step=spec):
            return Opening(frozenset({spec.name}))
        case ParallelNode(steps=members):
            return Opening(frozenset({members[0].name}))  # member 0: one count per run
        case BranchNode(paths=paths):
            return Opening(frozenset(path[0].name for path in paths.values() if path))
        case LoopNode(steps=body):
            iteration, index = loop_position(0, len(body))
            return Opening(frozenset({iteration_name(body[index].name, iteration)}))
        case ForEachNode(step=spec):
            return Opening(frozenset({iteration_name(spec.name, 0)}))
        case WaitNode(event=event):
            return Opening(gate=event)
    return Opening()  # a sub-saga: its child counts as a run of its own


def opens_run(openings: Iterable[Opening], event: str, fields: Mapping[str, Any]) -> bool:
    """Does ``event`` say a worker took the first node of a run with one of ``openings``
    (those of every version of its saga this process knows)?"""
    if event == "saga-step-started":
        step = fields.get("step")
        return fields.get("attempt") == 1 and any(step in o.records for o in openings)
    if event == "saga-waiting":
        return any(fields.get("event") == o.gate for o in openings if o.gate is not None)
    return False
