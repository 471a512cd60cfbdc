"""May this node message run? (guarantee 10)

The store enforces the same predicate with a conditional write, so two processes that both
decide RUN on the same snapshot cannot both claim the node.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from celery_saga.records import ExecutionRecord, ExecutionState, StepRecord, StepStatus


class Admission(str, Enum):
    RUN = "run"
    REJECT_MISSING = "missing"
    REJECT_NOT_LIVE = "not_live"
    HAND_BACK = "version_not_deployed"  # the run's version is not this process's
    REJECT_STALE_CURSOR = "stale_cursor"
    REJECT_IN_FLIGHT = "in_flight"
    REJECT_ALREADY_DONE = "already_done"
    REJECT_STALE_ATTEMPT = "stale_attempt"


@dataclass(frozen=True)
class NodeMessage:
    execution_id: str
    node: int
    sub: int
    member: int
    attempt: int


def decide_admission(
    execution: ExecutionRecord | None,
    record: StepRecord | None,
    message: NodeMessage,
    deployed_hash: str | None,
    now: datetime,
) -> Admission:
    if execution is None:
        return Admission.REJECT_MISSING
    if execution.state is not ExecutionState.RUNNING:
        return Admission.REJECT_NOT_LIVE
    if deployed_hash != execution.definition_hash:
        return Admission.HAND_BACK
    if (execution.cursor, execution.cursor_sub) != (message.node, message.sub):
        return Admission.REJECT_STALE_CURSOR
    if record is None:
        return Admission.RUN
    if record.status in (StepStatus.COMPLETED, StepStatus.FAILED):
        return Admission.REJECT_ALREADY_DONE
    if record.status is StepStatus.RUNNING:
        live = record.lease_expires_at is not None and record.lease_expires_at > now
        return Admission.REJECT_IN_FLIGHT if live else Admission.RUN
    # PENDING: a retry is scheduled; only the message for exactly that attempt may run it.
    if message.attempt != record.attempts + 1:
        return Admission.REJECT_STALE_ATTEMPT
    return Admission.RUN
