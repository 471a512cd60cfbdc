"""A run's graph for ``celery saga show``: the definition's nodes as a tree, each with the
status its step records, signals and history give it. Pure functions of the described run
(``timeline.describe``); nothing here reads the store."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, assert_never

from celery_saga.definition import nodes as kinds
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import Node, StepSpec, loop_body

NOT_RUN = "not run"
Tree = list[dict[str, Any]]


def _node(
    kind: str, name: str, status: str, detail: str | None = None, **more: Any
) -> dict[str, Any]:
    return {"kind": kind, "name": name, "status": status, "detail": detail, "children": [], **more}


def _records(run: dict[str, Any], index: int, spec: StepSpec) -> list[dict[str, Any]]:
    return [s for s in run["steps"] if s["node"] == index and s["step"] == spec.name]


def _step_status(record: dict[str, Any]) -> str:
    status = str(record["status"])
    reversal = record["compensation"]
    if reversal and reversal["status"]:
        status += f" -> {reversal['status']}"
    elif reversal and reversal["attempts"]:
        status += " -> reversing"
    return status


def _step(run: dict[str, Any], index: int, spec: StepSpec) -> dict[str, Any]:
    records = _records(run, index, spec)
    if not records:
        return _node("step", spec.name, NOT_RUN)
    last = records[-1]
    tries = f"{last['attempts']} attempts" if last["attempts"] > 1 else None
    return _node("step", spec.name, _step_status(last), tries, iterations=len(records))


def _overall(children: Sequence[dict[str, Any]]) -> str:
    """A group's status from its members': the first that is not simply done decides."""
    statuses = [c["status"].split(" -> ")[0] for c in children]
    for wanted in ("running", "failed", "pending"):
        if wanted in statuses:
            return wanted
    if statuses and all(s == NOT_RUN for s in statuses):
        return NOT_RUN
    if statuses and all(s == "completed" for s in statuses):
        return "completed"
    return "partly run" if statuses else NOT_RUN


def _branch(run: dict[str, Any], index: int, node: kinds.BranchNode) -> dict[str, Any]:
    taken = [
        (path, steps)
        for path, steps in node.paths.items()
        if any(_records(run, index, spec) for spec in steps)
    ]
    if not taken:
        return _node("branch", node.name, NOT_RUN, f"paths: {', '.join(node.paths)}")
    path, steps = taken[0]
    children = [_step(run, index, spec) for spec in steps]
    others = [p for p in node.paths if p != path]
    detail = f"path {path!r} taken" + (f", not {', '.join(others)}" if others else "")
    return {**_node("branch", node.name, _overall(children), detail), "children": children}


def _loop(
    run: dict[str, Any], index: int, node: kinds.LoopNode | kinds.ForEachNode
) -> dict[str, Any]:
    kind = "loop" if isinstance(node, kinds.LoopNode) else "for_each"
    children = [_step(run, index, spec) for spec in loop_body(node)]
    rounds = max((c.get("iterations", 0) for c in children), default=0)
    unit = "iteration" if kind == "loop" else "item"
    detail = f"{rounds} {unit}{'s' if rounds != 1 else ''} run"
    return {**_node(kind, node.name, _overall(children), detail), "children": children}


def _wait(run: dict[str, Any], index: int, node: kinds.WaitNode) -> dict[str, Any]:
    deadline = "no deadline" if node.timeout is None else f"deadline {node.timeout:g} s"
    detail = f"event {node.event!r}, {deadline}"
    received = [s for s in run["signals"] if s["event"] == node.event]
    timed_out = any(h["kind"] == "wait-timed-out" for h in run["history"])
    if run["state"] == "waiting" and run.get("cursor") == index:
        status = "waiting"
        if run["wake_at"]:
            detail += f", until {run['wake_at']}"
    elif received:
        status = f"signalled at {received[0]['received_at']}"
    elif timed_out and run.get("cursor") == index:
        status = "timed out"
    else:
        status = NOT_RUN
    return _node("wait", node.event, status, detail)


def _sub_saga(run: dict[str, Any], index: int, node: kinds.SubSagaNode) -> dict[str, Any]:
    records = [s for s in run["steps"] if s["node"] == index]
    if not records:
        return _node("sub_saga", node.name, NOT_RUN, f"saga {node.saga}")
    child = records[-1]["child"] or {}
    status = child.get("state") or _step_status(records[-1])
    detail = f"saga {node.saga}, run {child.get('id')}"
    return {**_node("sub_saga", node.name, status, detail), "children": child.get("tree", [])}


def _of(run: dict[str, Any], index: int, node: Node) -> dict[str, Any]:
    match node:
        case kinds.StepNode(step):
            return _step(run, index, step)
        case kinds.ParallelNode(name, steps):
            children = [_step(run, index, spec) for spec in steps]
            return {**_node("parallel", name, _overall(children)), "children": children}
        case kinds.BranchNode():
            return _branch(run, index, node)
        case kinds.LoopNode() | kinds.ForEachNode():
            return _loop(run, index, node)
        case kinds.WaitNode():
            return _wait(run, index, node)
        case kinds.SubSagaNode():
            return _sub_saga(run, index, node)
        case kinds.PivotNode():
            return _node("pivot", "pivot", "passed" if run["committed_at"] else NOT_RUN)
        case _:
            assert_never(node)


def tree(run: dict[str, Any], definition: SagaDefinition | None) -> Tree:
    """The run's nodes in definition order; without its definition, its step records."""
    if definition is None:
        return [
            _node("step", s["name"], _step_status(s), "version not registered here")
            for s in run["steps"]
        ]
    return [_of(run, index, node) for index, node in enumerate(definition.nodes)]


def render(nodes: Tree, indent: str = "") -> list[str]:
    """One line per node, members and child runs indented under their group."""
    lines = []
    for node in nodes:
        detail = f"  ({node['detail']})" if node["detail"] else ""
        label = node["name"] if node["kind"] == "step" else f"{node['kind']} {node['name']}"
        lines.append(f"{indent}{label}: {node['status']}{detail}")
        lines.extend(render(node["children"], indent + "  "))
    return lines
