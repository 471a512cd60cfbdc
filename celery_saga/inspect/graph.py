"""A run's graph: its definition's nodes in order, each with the status its step records,
signals and history give it, in the words of ``vocabulary``. The one graph builder: the
terminal, the web view and the Django admin each draw what it returns. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import assert_never

from celery_saga.definition import nodes as kinds
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import Node, StepSpec, loop_body
from celery_saga.inspect import vocabulary as words
from celery_saga.inspect.values import GraphNode, HistoryRow, RunView, SignalView, StepView
from celery_saga.records import CompensationOutcome, ExecutionRecord, ExecutionState


class _Run:
    """What the builder reads of a run: its record, steps, signals and history."""

    def __init__(
        self,
        record: ExecutionRecord,
        steps: Sequence[StepView],
        signals: Sequence[SignalView],
        history: Sequence[HistoryRow],
    ) -> None:
        self.record, self.steps, self.signals, self.history = record, steps, signals, history

    def records(self, index: int, name: str | None = None) -> list[StepView]:
        return [s for s in self.steps if s.node == index and name in (None, s.step)]


def _reversal(step: StepView) -> str | None:
    reversal = step.compensation
    if reversal is None:
        return None
    return words.reversal_word(reversal.status, reversal.attempts)


def _detail(step: StepView) -> str | None:
    parts = []
    if step.attempts > 1:
        parts.append(f"{step.attempts} attempts")
    reversal = step.compensation
    # those before a resume too (``story`` counts them): the resume reset them
    if reversal is not None and reversal.total_attempts > 1:
        parts.append(f"{reversal.total_attempts} reversal attempts")
    if reversal is not None and reversal.status == CompensationOutcome.RESOLVED.value:
        parts.append(reversal.reason or "done by hand")  # who, and the note
    return ", ".join(parts) or None


def _of_step(name: str, records: Sequence[StepView]) -> GraphNode:
    """A step: its latest record's status (a loop's body: its latest iteration's)."""
    if not records:
        return GraphNode("step", name, words.NOT_RUN)
    last = records[-1]
    reversal = _reversal(last)
    status = words.step_status(last.status, reversal)
    return GraphNode(
        "step", name, status, _detail(last), (), None, len(records), last.status, reversal
    )


def _step(run: _Run, index: int, spec: StepSpec) -> GraphNode:
    return _of_step(spec.name, run.records(index, spec.name))


def _group(kind: str, name: str, children: Sequence[GraphNode], detail: str | None) -> GraphNode:
    status = words.group_status(c.status for c in children)
    return GraphNode(kind, name, status, detail, tuple(children))


def _branch(run: _Run, index: int, node: kinds.BranchNode) -> GraphNode:
    """The path taken, its steps as children; the others named in the detail."""
    taken = [
        path for path, steps in node.paths.items() if any(run.records(index, s.name) for s in steps)
    ]
    if not taken:
        return GraphNode("branch", node.name, words.NOT_RUN, f"paths: {', '.join(node.paths)}")
    path = taken[0]
    children = [_step(run, index, spec) for spec in node.paths[path]]
    others = [p for p in node.paths if p != path]
    detail = f"path {path!r} taken" + (f", not {', '.join(others)}" if others else "")
    return _group("branch", node.name, children, detail)


def _loop(run: _Run, index: int, node: kinds.LoopNode | kinds.ForEachNode) -> GraphNode:
    kind = "loop" if isinstance(node, kinds.LoopNode) else "for_each"
    children = [_step(run, index, spec) for spec in loop_body(node)]
    rounds = max((c.iterations for c in children), default=0)
    unit = "iteration" if kind == "loop" else "item"
    detail = f"{rounds} {unit}{'s' if rounds != 1 else ''} run"
    return _group(kind, node.name, children, detail)


def _wait(run: _Run, index: int, node: kinds.WaitNode) -> GraphNode:
    """Waiting at the cursor; signalled once its event arrived; timed out when the run
    left it by its deadline; else not run."""
    record = run.record
    deadline = "no deadline" if node.timeout is None else f"deadline {node.timeout:g} s"
    detail = f"event {node.event!r}, {deadline}"
    received = [s for s in run.signals if s.event == node.event]
    timed_out = any(h.kind == "wait-timed-out" for h in run.history)
    if record.state is ExecutionState.WAITING and record.cursor == index:
        status = words.WAITING
        if record.wake_at is not None:
            detail += f", until {record.wake_at.isoformat()}"
    elif received:
        status = words.SIGNALLED
        detail += f", signalled at {received[0].received_at.isoformat()}"
    elif timed_out and record.cursor == index:
        status = words.TIMED_OUT
    else:
        status = words.NOT_RUN
    return GraphNode("wait", node.event, status, detail)


def _sub_saga(run: _Run, index: int, node: kinds.SubSagaNode) -> GraphNode:
    """The child run's state and nodes, linked; its record's status until it is read."""
    records = run.records(index)
    if not records:
        return GraphNode("sub_saga", node.name, words.NOT_RUN, f"saga {node.saga}")
    last = records[-1]
    child = last.child
    reversal = _reversal(last)
    status = words.step_status(last.status, reversal)
    children: tuple[GraphNode, ...] = ()
    if isinstance(child, RunView):
        status, children = child.state, child.graph
    link = None if child is None else child.id
    detail = f"saga {node.saga}, run {link}"
    return GraphNode(
        "sub_saga", node.name, status, detail, children, link, len(records), last.status, reversal
    )


def _of(run: _Run, index: int, node: Node) -> GraphNode:
    match node:
        case kinds.StepNode(step):
            return _step(run, index, step)
        case kinds.ParallelNode(name, steps):
            return _group("parallel", name, [_step(run, index, spec) for spec in steps], None)
        case kinds.BranchNode():
            return _branch(run, index, node)
        case kinds.LoopNode() | kinds.ForEachNode():
            return _loop(run, index, node)
        case kinds.WaitNode():
            return _wait(run, index, node)
        case kinds.SubSagaNode():
            return _sub_saga(run, index, node)
        case kinds.PivotNode():
            passed = run.record.committed_at is not None
            return GraphNode("pivot", "pivot", words.PASSED if passed else words.NOT_RUN)
        case _:
            assert_never(node)


def build(
    definition: SagaDefinition | None,
    record: ExecutionRecord,
    steps: Sequence[StepView],
    signals: Sequence[SignalView] = (),
    history: Sequence[HistoryRow] = (),
) -> tuple[GraphNode, ...]:
    """The run's nodes in definition order; without its definition (a version not
    registered here), one node per step record."""
    if definition is None:
        return tuple(
            GraphNode(
                "step",
                s.name,
                words.step_status(s.status, _reversal(s)),
                "version not registered here",
            )
            for s in steps
        )
    run = _Run(record, steps, signals, history)
    return tuple(_of(run, index, node) for index, node in enumerate(definition.nodes))


def flatten(nodes: Sequence[GraphNode], prefix: str = "") -> list[tuple[str, str]]:
    """(path, status) of every node, depth first: ``parallel group/p1``. What a view's
    rendering is compared by (``tests/test_one_story.py``)."""
    found = []
    for node in nodes:
        where = f"{prefix}{node.kind} {node.name}"
        found.append((where, node.status))
        found.extend(flatten(node.children, where + "/"))
    return found
