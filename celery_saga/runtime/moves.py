"""What a helper decided the run does next, returned as a value for one place to carry out.

Waits, sub-sagas, failures, cancels, the recovery sweep and the unwind's exits read and
write what their decision needs, then return one of these; ``Interpreter.carry_out`` does
the rest (the store write that follows, its events, then the publish), in one ``match``. A
new kind is one dataclass here and one case there. No helper holds or calls its owner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NoReturn

from celery_saga.decisions.admission import Admission, NodeMessage
from celery_saga.decisions.cursor import Advance
from celery_saga.decisions.unwind import UnwindStep
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import StepSpec
from celery_saga.errors import VersionNotDeployedError
from celery_saga.records import Attempt, CompensationOutcome, StepRecord


@dataclass(frozen=True)
class Stay:
    """Nothing more to do now: the run is parked, or someone else moves it."""


@dataclass(frozen=True)
class Moves:
    """Several moves, carried out in this order."""

    moves: tuple[Move, ...]


@dataclass(frozen=True)
class Announce:
    """Emit one saga event (after the moves before it in a ``Moves``)."""

    event: str
    fields: dict[str, Any] = field(hash=False, compare=False)


@dataclass(frozen=True)
class MoveOn:
    """The run moved to ``onward`` (committed): publish that position, or announce the end."""

    definition: SagaDefinition
    execution_id: str
    onward: Advance


@dataclass(frozen=True)
class PublishPosition:
    """Send the message(s) of the run's position (node, sub)."""

    definition: SagaDefinition
    execution_id: str
    node: int
    sub: int


@dataclass(frozen=True)
class StartQueued:
    """Send the first message(s) of a queued run that ``freed_by``, ending, gave its
    flow-control slot to, in the queued run's own trace (``trace``, stored with it)."""

    definition: SagaDefinition
    execution_id: str
    node: int
    sub: int
    trace: str | None
    freed_by: str


@dataclass(frozen=True)
class Settled:
    """The run ended or parked: a child tells its parent (guarantee 17)."""

    definition: SagaDefinition
    execution_id: str


@dataclass(frozen=True)
class BeginUnwind:
    """A failure was recorded and its write decided the unwind's first move; ``at``: the
    (node, sub) of a failure that no step raised."""

    definition: SagaDefinition
    execution_id: str
    plan: UnwindStep
    reason: str | None
    at: tuple[int, int] | None = None


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
    step: Attempt
    reason: str


@dataclass(frozen=True)
class CompleteStep:
    """Record ``step`` completed with ``result_blob`` and move the run on."""

    definition: SagaDefinition
    step: Attempt
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
    """Send a node message: the step ``spec``'s, or a control node's named ``label`` (a
    parent's sub-saga node, when its child ends), after ``countdown`` seconds."""

    definition: SagaDefinition
    message: NodeMessage
    label: str | None = None
    spec: StepSpec | None = None
    countdown: float | None = None


@dataclass(frozen=True)
class PublishReversal:
    """Send the message of attempt ``attempt`` of the reversal of step ``name``, after
    ``countdown`` seconds."""

    definition: SagaDefinition
    execution_id: str
    name: str
    attempt: int
    countdown: float | None = None


def next_reversal(
    definition: SagaDefinition, execution_id: str, record: StepRecord
) -> PublishReversal:
    """The message of the next reversal owed to ``record``."""
    return PublishReversal(definition, execution_id, record.name, record.compensation_attempts + 1)


@dataclass(frozen=True)
class RecordReversal:
    """Record the outcome of a parent's reversal of its child, then follow the unwind."""

    definition: SagaDefinition
    execution_id: str
    record: StepRecord
    outcome: CompensationOutcome
    reason: str | None


@dataclass(frozen=True)
class ContinueCancel:
    """Begin a cancelled run's unwind once nothing of it is going (guarantee 31)."""

    definition: SagaDefinition
    execution_id: str


@dataclass(frozen=True)
class CancelChild:
    """Cancel a child of a cancelled run, if it still runs or waits."""

    execution_id: str
    reason: str
    actor: str | None


@dataclass(frozen=True)
class HandOn:
    """Send ``command`` on a run whose version this process lacks to a worker that has it."""

    missing: VersionNotDeployedError
    execution_id: str
    command: str


Move = (
    Stay
    | Moves
    | Announce
    | MoveOn
    | PublishPosition
    | StartQueued
    | Settled
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
    | ContinueCancel
    | CancelChild
    | HandOn
)


def then(*moves: Move) -> Move:
    """``moves`` in order, without the ones that do nothing."""
    kept = tuple(m for m in moves if not isinstance(m, Stay))
    if not kept:
        return Stay()
    return kept[0] if len(kept) == 1 else Moves(kept)


def unreachable(value: NoReturn) -> NoReturn:
    """The ``case _`` of a match over every kind: mypy flags a kind left unhandled."""
    raise AssertionError(f"unhandled {value!r}")
