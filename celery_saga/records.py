"""Plain records of stored state, shared by the decisions, the store and the public API."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from celery_saga.definition.nodes import split_iteration


class ExecutionState(str, Enum):
    #: Stored beyond its flow-control limit: starts when a run of its key ends.
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    COMPENSATING = "compensating"
    COMPENSATION_STUCK = "compensation_stuck"
    #: A cancel was stored: no step starts, the bodies in flight are being stopped.
    CANCELLING = "cancelling"
    #: Cancelled, and what it had done unwound.
    CANCELLED = "cancelled"
    #: A step with ``on_failure="hold"`` failed for good: the run waits for an operator's
    #: move (retry, skip, unwind, cancel); nothing is reversed meanwhile.
    HELD = "held"

    @property
    def is_terminal(self) -> bool:
        return self in (ExecutionState.COMPLETED, ExecutionState.FAILED, ExecutionState.CANCELLED)


class RollbackStatus(str, Enum):
    COMPLETED = "completed"
    NOT_APPLICABLE = "not_applicable"
    STUCK = "stuck"


class StepStatus(str, Enum):
    PENDING = "pending"  # started before, waiting for its next attempt
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


class CompensationOutcome(str, Enum):
    COMPENSATED = "compensated"
    FAILED = "compensation_failed"
    SKIPPED = "compensation_skipped"
    #: An operator did the reversal by hand after it failed for good (``engine.resolve``).
    RESOLVED = "compensation_resolved"


@dataclass(frozen=True)
class ExecutionRecord:
    id: str
    saga_name: str
    definition_hash: str
    state: ExecutionState
    cursor: int
    cursor_sub: int
    input: Any
    failure_reason: str | None
    rollback_status: RollbackStatus | None
    rollback_reason: str | None
    committed_at: datetime | None
    parent_execution_id: str | None
    version: int
    created_at: datetime
    updated_at: datetime
    wake_at: datetime | None = None
    cancelled_at: datetime | None = None
    deadline_at: datetime | None = None
    #: The flow-control key the run was admitted (or queued) under; None: no limit.
    flow_key: str | None = None
    #: The W3C traceparent of the run's root span (``celery_saga.tracing``), if traced.
    trace_context: str | None = None


@dataclass(frozen=True)
class QueuePlace:
    """Where a queued run stands: its key, and how many runs of the key are ahead of it."""

    key: str
    ahead: int


@dataclass(frozen=True)
class DoorPlace:
    """A run's step waiting at a limited step's door (``step(concurrency=, rate=)``): for a
    slot of ``key``, or, with ``turn_at``, for its booked turn of the rate of ``key``."""

    step: str
    key: str
    turn_at: datetime | None = None


@dataclass(frozen=True)
class KeyLoad:
    """One key of a saga's flow-control limit: runs holding a slot, and runs queued."""

    saga: str
    key: str
    live: int
    limit: int
    queued: int
    oldest_queued: datetime | None
    #: "run" (``Saga(concurrency=)``: ``saga`` names the saga), or "step"
    #: (``step(concurrency=, rate=)``: ``saga`` names the step's task; ``live``: the
    #: slots granted, ``queued``: the steps waiting at its door; ``limit`` 0 for a rate).
    kind: str = "run"


@dataclass(frozen=True)
class StepRecord:
    """One step's journal row. ``id`` grows with first start, so it IS the start order."""

    id: int
    execution_id: str
    name: str
    node: int
    sub: int
    status: StepStatus
    attempts: int
    idempotency_key: str
    compensatable: bool
    result: Any = None
    error: str | None = None
    lease_expires_at: datetime | None = None
    started_at: datetime | None = None
    completed_at: datetime | None = None
    compensation_status: CompensationOutcome | None = None
    compensation_reason: str | None = None
    compensated_at: datetime | None = None
    compensation_attempts: int = 0
    compensation_lease_expires_at: datetime | None = None
    child_execution_id: str | None = None
    #: The worker process holding the forward (or reversal) claim: "node/pid/task id".
    holder: str | None = None
    compensation_holder: str | None = None
    #: The traceparent of the span of the forward attempt that last claimed it, if traced.
    trace_context: str | None = None


class Direction(str, Enum):
    """Which way an attempt goes: a step forward, or its reversal (the claim's kind)."""

    FORWARD = "step"
    REVERSE = "reversal"


@dataclass(frozen=True)
class Attempt:
    """One claimed attempt, either direction: which run, which record, which attempt, and
    (a step's) at which position. The store's writes for it hold only while the record is
    still this attempt's. A step's is built as ``Attempt(...)``, a reversal's as
    ``Attempt.reversal(...)`` (reversals are keyed by their record alone; position 0, 0)."""

    execution_id: str
    name: str
    node: int
    sub: int
    attempt: int
    #: When the attempt began (its history row's start); None where it is not known.
    claimed_at: datetime | None = None
    #: The process holding its claim ("node/pid/task id"); None where it is not known.
    holder: str | None = None
    direction: Direction = Direction.FORWARD

    def __post_init__(self) -> None:
        # A reversal's coordinates given in a step's order would shift every field.
        if type(self.attempt) is not int or type(self.node) is not int:
            raise TypeError(f"{self!r}: a reversal's attempt is built by Attempt.reversal")

    @classmethod
    def reversal(
        cls, run: str, name: str, attempt: int, at: datetime | None = None, by: str | None = None
    ) -> Attempt:
        """The attempt of a step's reversal (of run ``run``), begun ``at``, held ``by``."""
        return cls(run, name, 0, 0, attempt, at, by, Direction.REVERSE)


def completed_results(steps: Iterable[StepRecord]) -> dict[str, Any]:
    """Step name -> result for every completed step: what later steps see as ``results``.

    A loop body step also appears under its bare name with its latest completed iteration's
    result (``charge`` beside ``charge:0``, ``charge:1``); no record is stored for it.
    """
    results: dict[str, Any] = {}
    latest: dict[str, int] = {}
    for record in steps:
        if record.status is not StepStatus.COMPLETED:
            continue
        results[record.name] = record.result
        base, index = split_iteration(record.name)
        if index is not None and index >= latest.get(base, -1):
            latest[base] = index
    for base, index in latest.items():
        results[base] = results[f"{base}:{index}"]
    return results


@dataclass(frozen=True)
class Execution:
    """What ``SagaEngine.get`` returns: the execution row and its steps in start order."""

    record: ExecutionRecord
    steps: tuple[StepRecord, ...]
    #: The version (definition hash) the run waits for: a worker without it handed its
    #: message back, and no worker with it has taken the run since (None: not waiting).
    waiting_for_version: str | None = None
    #: A queued run's place: its flow-control key and how many of its runs are ahead.
    queued_behind: QueuePlace | None = None

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def state(self) -> ExecutionState:
        return self.record.state

    @property
    def rollback_status(self) -> RollbackStatus | None:
        return self.record.rollback_status

    @property
    def failure_reason(self) -> str | None:
        return self.record.failure_reason

    @property
    def results(self) -> dict[str, Any]:
        return completed_results(self.steps)

    def step(self, name: str) -> StepRecord:
        for record in self.steps:
            if record.name == name:
                return record
        raise KeyError(name)


@dataclass(frozen=True)
class Pause:
    """A stored pause; ``step`` None: the whole saga. ``held``: runs held at its door."""

    saga: str
    step: str | None
    reason: str
    actor: str | None
    paused_at: datetime
    held: int = 0

    @property
    def held_reason(self) -> str:
        """What a run held at its door says it is held for."""
        return f"paused: {self.reason}"
