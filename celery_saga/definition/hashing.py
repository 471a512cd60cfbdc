"""Structural hash of a saga graph (guarantee 22).

Covers what decides how a stored run is interpreted: node kinds and order, step and path names,
which callables run, whether a step has a compensation, wait events and child sagas. Tuning
(retries, timeouts, iteration limits) and the callables whose choices are journaled (branch
selectors, loop conditions, for_each items) are left out, so changing them does not orphan
running executions.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, assert_never

from celery_saga.definition import nodes as kinds
from celery_saga.definition.nodes import Node, StepSpec


def callable_identity(action: Any) -> str:
    """A Celery task's registered name, or a callable's qualified name."""
    task_name = getattr(action, "name", None)
    if isinstance(task_name, str) and hasattr(action, "apply_async"):
        return task_name
    # The qualified name without the module: a module run as a script is ``__main__`` in the
    # producer but ``shop`` in the worker, and must not look like a different graph.
    return str(getattr(action, "__qualname__", type(action).__qualname__))


def _step_shape(spec: StepSpec) -> list[Any]:
    compensation = None if spec.compensation is None else callable_identity(spec.compensation)
    return [spec.name, callable_identity(spec.action), compensation, spec.is_transform]


def node_shape(node: Node) -> list[Any]:
    """What a node is, as far as a stored run is concerned (see the module docstring)."""
    match node:
        case kinds.StepNode(step):
            return ["step", _step_shape(step)]
        case kinds.ParallelNode(name, steps):
            return ["parallel", name, [_step_shape(s) for s in steps]]
        case kinds.BranchNode(name, _, paths):
            shapes = {path: [_step_shape(s) for s in steps] for path, steps in paths.items()}
            return ["branch", name, sorted(shapes.items())]
        case kinds.WaitNode(event):
            return ["wait", event]
        case kinds.SubSagaNode(name, saga):
            return ["sub_saga", name, saga]
        case kinds.LoopNode(name, kind, _, steps):
            return [kind.value, name, [_step_shape(s) for s in steps]]
        case kinds.ForEachNode(name, _, step):
            return ["for_each", name, _step_shape(step)]
        case kinds.PivotNode():
            return ["pivot"]
        case _:
            assert_never(node)


def shape_text(saga: str, nodes: Sequence[Node], label: str | None = None) -> str:
    """What the hash covers, as the JSON text it hashes: the graph's shape, and the
    ``version=`` label when there is one. Stored with the version, it lets a process without
    the version's code judge its runs (``definition/shapes.py``)."""
    shape: list[Any] = [saga, [node_shape(node) for node in nodes]]
    if label is not None:
        shape.append(["version", label])
    return json.dumps(shape, sort_keys=True)


def hash_of_text(text: str) -> str:
    """The structural hash of a shape's JSON text (``shape_text``)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def structural_hash(saga: str, nodes: Sequence[Node], label: str | None = None) -> str:
    """The version's identity: the graph's shape, and the ``version=`` label when there is
    one (so a label tells apart two versions whose step bodies changed but not their shape).
    A saga without a label hashes as it always did."""
    return hash_of_text(shape_text(saga, nodes, label))
