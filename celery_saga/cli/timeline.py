"""A run's whole story for ``celery saga show``: pure functions from stored records to a
JSON-ready dict and to readable lines."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from celery_saga.cli import graph, waiting
from celery_saga.cli.chronology import earlier_reversal_attempts, events
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import (
    BranchNode,
    ForEachNode,
    LoopNode,
    ParallelNode,
    SubSagaNode,
    WaitNode,
    split_iteration,
)
from celery_saga.records import ExecutionRecord, ExecutionState, StepRecord
from celery_saga.store.inspection import StoredRun

#: How deep ``show`` follows child runs; sub-sagas may nest, a cycle cannot be registered.
MAX_DEPTH = 8
LoadRun = Callable[[str], "StoredRun | None"]
#: Finds the definition of (saga name, version hash) deployed in this process.
FindDefinition = Callable[[str, str], "SagaDefinition | None"]


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _enclosing(definition: SagaDefinition | None, node: int) -> dict[str, str] | None:
    """The group a step ran in: a parallel group, a branch, a loop, or a sub-saga."""
    if definition is None or not 0 <= node < len(definition.nodes):
        return None
    target = definition.nodes[node]
    kinds: tuple[tuple[type[Any], str], ...] = (
        (ParallelNode, "parallel"),
        (BranchNode, "branch"),
        (LoopNode, "loop"),
        (ForEachNode, "for_each"),
        (SubSagaNode, "sub_saga"),
    )
    for kind, label in kinds:
        if isinstance(target, kind):
            return {"kind": label, "name": str(getattr(target, "name", ""))}
    return None


def _step(
    record: StepRecord,
    definition: SagaDefinition | None,
    load: LoadRun,
    find: FindDefinition,
    depth: int,
) -> dict[str, Any]:
    base, iteration = split_iteration(record.name)
    step: dict[str, Any] = {
        "name": record.name,
        "step": base,
        "iteration": iteration,
        "node": record.node,
        "within": _enclosing(definition, record.node),
        "status": record.status.value,
        "attempts": record.attempts,
        "idempotency_key": record.idempotency_key,
        "started_at": _time(record.started_at),
        "completed_at": _time(record.completed_at),
        "error": record.error,
        "result": record.result,
        "holder": record.holder if record.lease_expires_at is not None else None,
        "compensatable": record.compensatable,
        "compensation": None,
        "child": None,
    }
    if record.compensation_status is not None or record.compensation_attempts:
        step["compensation"] = {
            "status": record.compensation_status.value if record.compensation_status else None,
            "reason": record.compensation_reason,
            "attempts": record.compensation_attempts,
            "at": _time(record.compensated_at),
            "holder": (
                record.compensation_holder
                if record.compensation_lease_expires_at is not None
                else None
            ),
        }
    if record.child_execution_id is not None:
        child = load(record.child_execution_id) if depth < MAX_DEPTH else None
        step["child"] = (
            describe(child, load, find, depth + 1)
            if child is not None
            else {"id": record.child_execution_id, "missing": True}
        )
    return step


def summary(record: ExecutionRecord) -> dict[str, Any]:
    """Who a run is and how it stands: the fields ``list`` and ``show`` share."""
    return {
        "id": record.id,
        "saga": record.saga_name,
        "state": record.state.value,
        "rollback_status": record.rollback_status.value if record.rollback_status else None,
        "failure_reason": record.failure_reason,
        "rollback_reason": record.rollback_reason,
        "parent_execution_id": record.parent_execution_id,
        "version": record.definition_hash,
    }


def describe(run: StoredRun, load: LoadRun, find: FindDefinition, depth: int = 0) -> dict[str, Any]:
    """Everything stored about ``run`` (and its child runs, nested under their step): its
    records, its graph as a tree (``graph.tree``) and its timeline (``events``)."""
    record = run.record
    definition = find(record.saga_name, record.definition_hash)
    described = {
        **summary(record),
        "definition_hash": record.definition_hash,
        "definition_deployed": definition is not None and definition.hash == record.definition_hash,
        "created_at": _time(record.created_at),
        "updated_at": _time(record.updated_at),
        "committed_at": _time(record.committed_at),
        "wake_at": _time(record.wake_at),
        "archived_at": _time(run.archived_at),
        "cursor": record.cursor,
        "input": record.input,
        "signals": [
            {"event": s.event, "payload": s.payload, "received_at": _time(s.received_at)}
            for s in run.signals
        ],
        "steps": [_step(s, definition, load, find, depth) for s in run.steps],
        "history": [
            {
                "id": h.id,
                "at": _time(h.at),
                "kind": h.kind,
                "step": h.step,
                "attempt": h.attempt,
                "holder": h.holder,
                "actor": h.actor,
                "detail": h.detail,
                "data": h.data,
                "started_at": _time(h.started_at),
            }
            for h in run.history
        ],
    }
    _count_resumed_attempts(described)
    described["waiting_for_event"] = waited_event(described, definition)
    described["tree"] = graph.tree(described, definition)
    described["timeline"] = events(described)
    return described


def gate_event(find: FindDefinition, record: ExecutionRecord) -> str | None:
    """The event a waiting run waits for, from its definition (None: not waiting, or its
    version is not registered here)."""
    if record.state is not ExecutionState.WAITING:
        return None
    definition = find(record.saga_name, record.definition_hash)
    nodes = definition.nodes if definition is not None else ()
    gate = nodes[record.cursor] if 0 <= record.cursor < len(nodes) else None
    return gate.event if isinstance(gate, WaitNode) else None


def describe_again(load: LoadRun, find: FindDefinition, execution_id: str) -> dict[str, Any] | None:
    """The run described afresh (``show --follow``); None once it is deleted."""
    run = load(execution_id)
    return None if run is None else describe(run, load, find)


def waited_event(run: dict[str, Any], definition: SagaDefinition | None) -> str | None:
    """The event a waiting run waits for: its gate in the definition, else the last
    ``wait-entered`` row of its history (a version not registered here)."""
    if run["state"] != "waiting":
        return None
    if definition is not None and 0 <= run["cursor"] < len(definition.nodes):
        gate = definition.nodes[run["cursor"]]
        if isinstance(gate, WaitNode):
            return gate.event
    entered = [h["data"] for h in run["history"] if h["kind"] == "wait-entered"]
    return str(entered[-1]["event"]) if entered and isinstance(entered[-1], dict) else None


def _count_resumed_attempts(run: dict[str, Any]) -> None:
    """A resume resets a reversal's attempts; its ``resumed`` rows keep the earlier ones."""
    earlier = earlier_reversal_attempts(run["history"])
    for step in run["steps"]:
        before = earlier.get(step["name"], 0)
        if before and step["compensation"] is None:
            step["compensation"] = {
                "status": None,
                "reason": None,
                "attempts": 0,
                "at": None,
                "holder": None,
            }
        if step["compensation"] is not None:
            step["compensation"]["total_attempts"] = step["compensation"]["attempts"] + before


def _held(run: dict[str, Any]) -> list[str]:
    """Who holds each claim in flight: the worker process a takeover would ask."""
    lines = []
    for step in run["steps"]:
        if step["holder"]:
            lines.append(f"running: {step['name']} held by {step['holder']}")
        reversal = step["compensation"]
        if reversal and reversal.get("holder"):
            lines.append(f"reversing: {step['name']} held by {reversal['holder']}")
    return lines


def render(run: dict[str, Any]) -> list[str]:
    """The run as text: a header, its graph as a tree, then its timeline in time order."""
    rollback = run["rollback_status"] or "-"
    lines = [
        f"execution {run['id']}  saga={run['saga']}  state={run['state']}  rollback={rollback}",
        f"created {run['created_at']}  updated {run['updated_at']}",
    ]
    if run["archived_at"]:
        lines.append(f"archived {run['archived_at']}")
    if run["parent_execution_id"]:
        lines.append(f"parent {run['parent_execution_id']}")
    waits = waiting.described(run)
    if waits and run.get("waiting_for_version"):
        waits += "; a worker that has it carries the run on (`saga versions`)"
    if waits:
        lines.append(waits)
    if not run["definition_deployed"]:
        lines.append(f"version {run['definition_hash']}: not registered in this process")
    for label in ("failure_reason", "rollback_reason"):
        if run[label]:
            lines.append(f"{label}: {run[label]}")
    if run["state"] == "compensation_stuck":
        lines.append(
            "parked: fix the cause, then `saga resume ID` retries the failed reversal; "
            "`saga abandon ID` gives the unwind up"
        )
    lines.extend(_held(run))
    lines.append("graph:")
    lines.extend(graph.render(run["tree"], "  "))
    lines.append("timeline:")
    lines.extend(render_events(run["timeline"]))
    return lines


def render_events(timeline: list[dict[str, Any]]) -> list[str]:
    """Timeline entries as lines: offset from the run's start, what happened, how long."""
    lines = []
    for entry in timeline:
        took = f"  ({entry['took']})" if entry["took"] else ""
        by = f"  by {entry['actor']}" if entry["actor"] else ""
        indent = "  | " * entry["depth"]
        lines.append(f"  +{entry['offset_ms']:10.1f} ms  {indent}{entry['text']}{took}{by}")
    return lines
