"""Conversion of result rows into the plain records of ``celery_saga.records``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from celery_saga.records import (
    CompensationOutcome,
    ExecutionRecord,
    ExecutionState,
    RollbackStatus,
    StepRecord,
    StepStatus,
)
from celery_saga.store.codec import unpack
from celery_saga.store.database import from_db_time

#: Reads a stored payload: ``unpack`` for the engine, ``unpack_or_sealed`` for listings.
Opener = Callable[[bytes | None], Any]


def execution_from_row(row: Mapping[Any, Any], opener: Opener = unpack) -> ExecutionRecord:
    created_at = from_db_time(row["created_at"])
    updated_at = from_db_time(row["updated_at"])
    assert created_at is not None and updated_at is not None
    rollback = row["rollback_status"]
    return ExecutionRecord(
        id=row["id"],
        saga_name=row["saga_name"],
        definition_hash=row["definition_hash"],
        state=ExecutionState(row["state"]),
        cursor=row["cursor"],
        cursor_sub=row["cursor_sub"],
        input=opener(row["input"]),
        failure_reason=row["failure_reason"],
        rollback_status=RollbackStatus(rollback) if rollback else None,
        rollback_reason=row["rollback_reason"],
        committed_at=from_db_time(row["committed_at"]),
        parent_execution_id=row["parent_execution_id"],
        version=row["version"],
        created_at=created_at,
        updated_at=updated_at,
        wake_at=from_db_time(row["wake_at"]),
        cancelled_at=from_db_time(row.get("cancelled_at")),
        deadline_at=from_db_time(row.get("deadline_at")),
        flow_key=row.get("flow_key"),
        trace_context=row.get("trace_context"),
    )


def step_from_row(row: Mapping[Any, Any], prefix: str = "", opener: Opener = unpack) -> StepRecord:
    def get(name: str) -> Any:
        return row[prefix + name]

    compensation = get("compensation_status")
    return StepRecord(
        id=get("id"),
        execution_id=get("execution_id"),
        name=get("name"),
        node=get("node"),
        sub=get("sub"),
        status=StepStatus(get("status")),
        attempts=get("attempts"),
        idempotency_key=get("idempotency_key"),
        compensatable=bool(get("compensatable")),
        result=opener(get("result")),
        error=get("error"),
        lease_expires_at=from_db_time(get("lease_expires_at")),
        started_at=from_db_time(get("started_at")),
        completed_at=from_db_time(get("completed_at")),
        compensation_status=CompensationOutcome(compensation) if compensation else None,
        compensation_reason=get("compensation_reason"),
        compensated_at=from_db_time(get("compensated_at")),
        compensation_attempts=get("compensation_attempts"),
        compensation_lease_expires_at=from_db_time(get("compensation_lease_expires_at")),
        child_execution_id=get("child_execution_id"),
        holder=get("holder"),
        compensation_holder=get("compensation_holder"),
        trace_context=row.get(prefix + "trace_context"),
    )
