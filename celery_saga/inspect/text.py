"""A run as lines of text: a header, its graph as a tree, then its timeline in time order,
as ``celery saga show`` prints it and the web view's run page quotes its timeline. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from celery_saga.inspect.values import GraphNode, RunView, TimelineEntry


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def graph_lines(nodes: Sequence[GraphNode], indent: str = "") -> list[str]:
    """One line per node, members and child runs indented under their group."""
    lines = []
    for node in nodes:
        detail = f"  ({node.detail})" if node.detail else ""
        label = node.name if node.kind == "step" else f"{node.kind} {node.name}"
        lines.append(f"{indent}{label}: {node.status}{detail}")
        lines.extend(graph_lines(node.children, indent + "  "))
    return lines


def timeline_lines(entries: Sequence[TimelineEntry]) -> list[str]:
    """Timeline entries as lines: offset from the run's start, what happened, how long."""
    lines = []
    for entry in entries:
        took = f"  ({entry.took})" if entry.took else ""
        by = f"  by {entry.actor}" if entry.actor else ""
        indent = "  | " * entry.depth
        lines.append(f"  +{entry.offset_ms:10.1f} ms  {indent}{entry.text}{took}{by}")
    return lines


def _held(run: RunView) -> list[str]:
    """Who holds each claim in flight: the worker process a takeover would ask."""
    lines = []
    for step in run.steps:
        if step.holder:
            lines.append(f"running: {step.name} held by {step.holder}")
        reversal = step.compensation
        if reversal is not None and reversal.holder:
            lines.append(f"reversing: {step.name} held by {reversal.holder}")
    return lines


def hold_lines(run: RunView) -> list[str]:
    """A held run's step, error, attempts and hold timeout, and the moves open to it."""
    hold = run.hold
    if hold is None:
        return []
    timeout = f"unwinds at {_time(hold.unwinds_at)}" if hold.unwinds_at else "none"
    return [
        f"held step: {hold.step}  attempts: {hold.attempts}  error: {hold.error or '-'}",
        f"hold timeout: {timeout}",
        "held: `saga retry ID` runs the step again, `saga skip ID --result JSON` completes "
        "it by hand, `saga unwind ID` (before the pivot) or `saga cancel ID` gives the run up",
    ]


def run_lines(run: RunView) -> list[str]:
    """The run as text: a header, its graph as a tree, then its timeline."""
    record = run.record
    rollback = run.rollback_status or "-"
    lines = [
        f"execution {run.id}  saga={run.saga}  state={run.state}  rollback={rollback}",
        f"created {_time(record.created_at)}  updated {_time(record.updated_at)}",
    ]
    if run.archived_at:
        lines.append(f"archived {_time(run.archived_at)}")
    if record.parent_execution_id:
        lines.append(f"parent {record.parent_execution_id}")
    if run.labels:
        lines.append("labels " + "  ".join(f"{key}={value}" for key, value in run.labels))
    if run.trace_id:
        lines.append(f"trace {run.trace_id}")
    waits = run.waiting
    if waits and run.waiting_for_version:
        waits += "; a worker that has it carries the run on (`saga versions`)"
    if waits:
        lines.append(waits)
    if not run.definition_deployed:
        lines.append(f"version {record.definition_hash}: not registered in this process")
    for label, text in (
        ("failure_reason", record.failure_reason),
        ("rollback_reason", record.rollback_reason),
    ):
        if text:
            lines.append(f"{label}: {text}")
    if run.state == "compensation_stuck":
        lines.append(
            "parked: fix the cause, then `saga resume ID` retries the failed reversal; "
            "`saga abandon ID` gives the unwind up"
        )
    lines.extend(_held(run))
    lines.extend(hold_lines(run))
    lines.append("graph:")
    lines.extend(graph_lines(run.graph, "  "))
    lines.append("timeline:")
    lines.extend(timeline_lines(run.timeline.entries))
    return lines
