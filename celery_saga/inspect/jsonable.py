"""The read model as JSON text: ``celery saga show --json`` and ``--follow --json`` print
it, in the shape they always printed (keys are only ever added), and any stored value
(datetimes, decimals, bytes) gets a readable form."""

from __future__ import annotations

import base64
import json
from datetime import date, datetime, timedelta
from decimal import Decimal
from enum import Enum
from typing import Any
from uuid import UUID

from celery_saga.inspect.values import (
    GraphNode,
    HistoryRow,
    ListedRun,
    MissingChild,
    RunList,
    RunView,
    StepView,
    TimelineEntry,
)
from celery_saga.records import ExecutionRecord, ExecutionState
from celery_saga.store.inspection import Stats


def _plain(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (Decimal, UUID)):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return repr(value)


def as_json(value: Any) -> str:
    """Stored payloads may hold datetimes, decimals, bytes: each gets a readable form."""
    return json.dumps(value, default=_plain, indent=2, sort_keys=False)


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _node(node: GraphNode) -> dict[str, Any]:
    shown: dict[str, Any] = {
        "kind": node.kind,
        "name": node.name,
        "status": node.status,
        "detail": node.detail,
        "children": [_node(child) for child in node.children],
    }
    if node.kind == "step" and node.iterations:
        shown["iterations"] = node.iterations
    if node.link is not None:
        shown["link"] = node.link
    return shown


def _entry(entry: TimelineEntry) -> dict[str, Any]:
    return {
        "at": _time(entry.at),
        "kind": entry.kind,
        "text": entry.text,
        "step": entry.step,
        "took": entry.took,
        "actor": entry.actor,
        "history_id": entry.history_id,
        "depth": entry.depth,
        "offset_ms": entry.offset_ms,
    }


def _history(row: HistoryRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "at": _time(row.at),
        "kind": row.kind,
        "step": row.step,
        "attempt": row.attempt,
        "holder": row.holder,
        "actor": row.actor,
        "detail": row.detail,
        "data": row.data,
        "started_at": _time(row.started_at),
    }


def _step(step: StepView) -> dict[str, Any]:
    reversal = step.compensation
    child: dict[str, Any] | None = None
    if isinstance(step.child, MissingChild):
        child = {"id": step.child.id, "missing": True}
    elif step.child is not None:
        child = _run(step.child)
    return {
        "name": step.name,
        "step": step.step,
        "iteration": step.iteration,
        "node": step.node,
        "within": None if step.within is None else vars(step.within).copy(),
        "status": step.status,
        "attempts": step.attempts,
        "idempotency_key": step.idempotency_key,
        "started_at": _time(step.started_at),
        "completed_at": _time(step.completed_at),
        "error": step.error,
        "result": step.result,
        "holder": step.holder,
        "compensatable": step.compensatable,
        "compensation": None
        if reversal is None
        else {
            "status": reversal.status,
            "reason": reversal.reason,
            "attempts": reversal.attempts,
            "at": _time(reversal.at),
            "holder": reversal.holder,
            "total_attempts": reversal.total_attempts,
        },
        "child": child,
    }


def _run(run: RunView) -> dict[str, Any]:
    record = run.record
    return {
        **_summary(record),
        "definition_hash": record.definition_hash,
        "definition_deployed": run.definition_deployed,
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
        "steps": [_step(step) for step in run.steps],
        "history": [_history(row) for row in run.history],
        "waiting_for_event": run.waiting_for_event,
        "tree": [_node(node) for node in run.graph],
        "timeline": [_entry(entry) for entry in run.timeline.entries],
        "waiting_for_version": run.waiting_for_version,
        "waiting": run.waiting,
        "labels": dict(run.labels),
    }


def _summary(record: ExecutionRecord) -> dict[str, Any]:
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


def _listed(listed: ListedRun | None) -> dict[str, Any] | None:
    if listed is None:
        return None
    record = listed.record
    return {
        **_summary(record),
        "waiting_for_version": listed.waiting_for_version,
        "waiting_for_event": listed.waiting_for_event,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
    }


def list_json(page: RunList) -> str:
    """A page of runs as ``list --json`` prints it."""
    return as_json({"items": [_listed(r) for r in page.items], "next_cursor": page.next_cursor})


def stats_json(
    stats: Stats, oldest_waiting: ListedRun | None, oldest_parked: ListedRun | None
) -> str:
    """The counts as ``stats --json`` prints them."""
    by_state: dict[str, int] = {}
    sagas: dict[str, dict[str, int]] = {}
    for (name, state), runs in sorted(stats.counts.items()):
        by_state[state] = by_state.get(state, 0) + runs
        sagas.setdefault(name, {})[state] = runs
    parked = by_state.get(ExecutionState.COMPENSATION_STUCK.value, 0)
    oldest = {"waiting": _listed(oldest_waiting), "parked": _listed(oldest_parked)}
    summary = {"by_state": by_state, "by_saga": sagas, "parked": parked}
    return as_json({**summary, "archived": stats.archived, "oldest": oldest})


def run_json(run: RunView) -> str:
    """The run as ``show --json`` prints it."""
    return as_json(_run(run))


def entry_json(entry: TimelineEntry) -> str:
    """One timeline entry on one line, as ``show --follow --json`` prints it."""
    return json.dumps(_entry(entry), default=str)
