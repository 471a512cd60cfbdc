"""A run's definition as boxes coloured by status: pure, from the definition and the run as
``timeline.describe`` gives it (redacted), for the run page's template to draw."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, assert_never

from celery_saga.definition import nodes as kinds
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import Node, StepSpec

NOT_REACHED = "not_reached"
#: The status a group shows: the first of these any box inside it has (what needs an eye
#: first), else ``NOT_REACHED``.
_GROUP_ORDER = (
    "compensation_failed",
    "failed",
    "running",
    "pending",
    "waiting",
    "compensated",
    "compensation_skipped",
    "completed",
)


@dataclass(frozen=True)
class Box:
    """One node or step. ``kind``: step, parallel, branch, path, loop, for_each, wait,
    pivot or sub_saga; ``children`` are drawn inside it (side by side for ``parallel`` and
    ``branch``, in order otherwise); ``link``: the child run of a sub-saga; ``forward``: the
    step's own status when its reversal's outcome is ``status`` (a failed step that was
    compensated must not look like a completed one that was)."""

    kind: str
    label: str
    status: str
    detail: str = ""
    children: tuple[Box, ...] = ()
    link: str | None = None
    forward: str = ""

    @property
    def side_by_side(self) -> bool:
        return self.kind in ("parallel", "branch")


def step_status(step: Mapping[str, Any] | None) -> str:
    """A step record's colour: its reversal's outcome once it has one, else its own."""
    if step is None:
        return NOT_REACHED
    reversal = step.get("compensation")
    if reversal and reversal.get("status"):
        return str(reversal["status"])
    return str(step["status"])


def forward_status(step: Mapping[str, Any] | None) -> str:
    """The step's own status when ``step_status`` gives its reversal's, else ""."""
    if step is None or not (step.get("compensation") or {}).get("status"):
        return ""
    return str(step["status"])


def group_status(statuses: Iterable[str]) -> str:
    seen = set(statuses)
    return next((status for status in _GROUP_ORDER if status in seen), NOT_REACHED)


def _attempts(step: Mapping[str, Any] | None) -> str:
    if step is None:
        return ""
    parts = []
    if step["attempts"] > 1:
        parts.append(f"{step['attempts']} attempts")
    reversal = step.get("compensation")
    # those before a resume too (``timeline.describe`` counts them): the resume reset them
    if reversal and reversal["total_attempts"] > 1:
        parts.append(f"{reversal['total_attempts']} reversal attempts")
    return ", ".join(parts)


def _step(spec: StepSpec, steps: Mapping[str, Mapping[str, Any]]) -> Box:
    record = steps.get(spec.name)
    status, forward = step_status(record), forward_status(record)
    return Box("step", spec.name, status, _attempts(record), forward=forward)


def _repeated(spec: StepSpec, iterations: Mapping[str, list[Mapping[str, Any]]]) -> Box:
    """A loop body step: the colour of its latest iteration, and how many ran."""
    runs = iterations.get(spec.name, [])
    latest = runs[-1] if runs else None
    detail = f"{len(runs)} iteration(s)" if runs else ""
    return Box("step", spec.name, step_status(latest), detail, forward=forward_status(latest))


def _group(kind: str, label: str, children: tuple[Box, ...], detail: str = "") -> Box:
    return Box(kind, label, group_status(c.status for c in children), detail, children)


def _node(
    index: int,
    node: Node,
    run: Mapping[str, Any],
    steps: Mapping[str, Mapping[str, Any]],
    iterations: Mapping[str, list[Mapping[str, Any]]],
) -> Box:
    match node:
        case kinds.StepNode(step):
            return _step(step, steps)
        case kinds.ParallelNode(name, members):
            return _group("parallel", name, tuple(_step(s, steps) for s in members))
        case kinds.BranchNode(name, _, paths):
            return _group("branch", name, tuple(_path(n, p, steps) for n, p in paths.items()))
        case kinds.LoopNode(name, kind, _, body, most):
            inner = tuple(_repeated(s, iterations) for s in body)
            return _group("loop", name, inner, f"{kind.value}, at most {most}")
        case kinds.ForEachNode(name, _, step, most):
            return _group("for_each", name, (_repeated(step, iterations),), f"at most {most}")
        case kinds.WaitNode():
            return _wait(index, node, run)
        case kinds.SubSagaNode(name, saga):
            record = steps.get(name)
            child = record.get("child") if record else None
            link = str(child["id"]) if child else None
            status, forward = step_status(record), forward_status(record)
            return Box("sub_saga", name, status, f"saga {saga}", (), link, forward)
        case kinds.PivotNode():
            return Box("pivot", "pivot", "completed" if run.get("committed_at") else NOT_REACHED)
        case _:
            assert_never(node)


def _path(name: str, path: tuple[StepSpec, ...], steps: Mapping[str, Mapping[str, Any]]) -> Box:
    inner = tuple(_step(s, steps) for s in path)
    taken = any(box.status != NOT_REACHED for box in inner)
    return _group("path", name, inner, "taken" if taken else "")


def _wait(index: int, node: kinds.WaitNode, run: Mapping[str, Any]) -> Box:
    received = {signal["event"] for signal in run["signals"]}
    deadline = "" if node.timeout is None else f"timeout {node.timeout:g} s"
    if node.event in received:
        status = "completed"
    elif run["state"] == "waiting" and run.get("cursor") == index:
        status = "waiting"
    else:
        status = NOT_REACHED
    return Box("wait", f"wait for {node.event!r}", status, deadline)


def draw(definition: SagaDefinition, run: Mapping[str, Any]) -> tuple[Box, ...]:
    """The boxes of ``definition``'s nodes, in order, coloured by ``run`` (a described run
    with ``cursor`` added: the node it stands at)."""
    steps = {step["name"]: step for step in run["steps"]}
    iterations: dict[str, list[Mapping[str, Any]]] = {}
    for step in run["steps"]:
        if step["iteration"] is not None:
            iterations.setdefault(step["step"], []).append(step)
    for runs in iterations.values():
        runs.sort(key=lambda step: step["iteration"])
    return tuple(
        _node(index, node, run, steps, iterations) for index, node in enumerate(definition.nodes)
    )
