"""What a helper decided the run does next, returned as a value for its owner to carry out.

Waits, sub-sagas and child unwinds read and write what their decision needs, then return
one of these; ``Executor.carry_out`` and ``Unwinder.carry_out`` do the rest (the store
write that follows, then the publish). No helper holds or calls its owner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NoReturn

from celery_saga.decisions.admission import Admission, NodeMessage
from celery_saga.decisions.cursor import Advance
from celery_saga.decisions.unwind import UnwindStep
from celery_saga.definition.builder import SagaDefinition
from celery_saga.records import CompensationOutcome, StepAttempt, StepRecord


@dataclass(frozen=True)
class Stay:
    """Nothing more to do now: the run is parked, or someone else moves it."""


@dataclass(frozen=True)
class MoveOn:
    """The run moved to ``onward`` (committed): publish that position, or announce the end."""

    definition: SagaDefinition
    execution_id: str
    onward: Advance


@dataclass(frozen=True)
class BeginUnwind:
    """A failure was recorded and its write decided the unwind's first move."""

    definition: SagaDefinition
    execution_id: str
    plan: UnwindStep
    reason: str | None


@dataclass(frozen=True)
class FollowUnwind:
    """Carry an unwind on with the move its last record decided (None: nothing to do)."""

    definition: SagaDefinition
    execution_id: str
    plan: UnwindStep | None


@dataclass(frozen=True)
class FailRun:
    """Fail a live run for a reason no step raised, and unwind it; ``at``: the (node, sub)
    whose message found the reason."""

    definition: SagaDefinition
    execution_id: str
    reason: str
    at: tuple[int, int] | None = None


@dataclass(frozen=True)
class Refuse:
    """Drop the node message (logged and announced)."""

    message: NodeMessage
    verdict: Admission


@dataclass(frozen=True)
class FailStep:
    """Record ``step`` failed for good (a child that failed)."""

    definition: SagaDefinition
    step: StepAttempt
    reason: str


@dataclass(frozen=True)
class CompleteStep:
    """Record ``step`` completed with ``result_blob`` and move the run on."""

    definition: SagaDefinition
    step: StepAttempt
    result_blob: bytes
    onward: Advance
    fields: dict[str, Any] = field(hash=False, compare=False)


@dataclass(frozen=True)
class StartChild:
    """Store a child run (its id already claimed by the parent's record) and launch it."""

    definition: SagaDefinition
    child_input: Any = field(hash=False)
    child_id: str
    parent_id: str


@dataclass(frozen=True)
class PublishNode:
    """Send a node message named ``label`` (a parent's sub-saga node, when its child ends)."""

    definition: SagaDefinition
    message: NodeMessage
    label: str


@dataclass(frozen=True)
class PublishReversal:
    """Send the message of the next reversal owed to ``record``."""

    definition: SagaDefinition
    execution_id: str
    record: StepRecord


@dataclass(frozen=True)
class RecordReversal:
    """Record the outcome of a parent's reversal of its child, then follow the unwind."""

    definition: SagaDefinition
    execution_id: str
    record: StepRecord
    outcome: CompensationOutcome
    reason: str | None


Move = (
    Stay
    | MoveOn
    | BeginUnwind
    | FollowUnwind
    | FailRun
    | Refuse
    | FailStep
    | CompleteStep
    | StartChild
    | PublishNode
    | PublishReversal
    | RecordReversal
)
#: The moves an unwind carries out on its own; the rest belong to the forward executor.
UnwindMove = Stay | BeginUnwind | FollowUnwind | PublishNode | PublishReversal | RecordReversal


def unreachable(value: NoReturn) -> NoReturn:
    """The ``case _`` of a match over every kind: mypy flags a kind left unhandled."""
    raise AssertionError(f"unhandled {value!r}")
