"""Running one claimed attempt, either direction: its context, its body under the claim's
lease (renewed by a heartbeat), then what its outcome leads to (guarantees 20, 27, 30).

What differs between a step and a reversal (how the context is read, how the body is
called, what its success and its failure record) is an ``AttemptBody``; the order is the
same for both and lives here once: the store or a payload key failing while the context
is read is not the attempt's (its claim waits for its lease); anything the body raises,
``sys.exit()`` included, is; the worker's own shutdown is not (the claim is given up and
the message sent again).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from sqlalchemy.exc import SQLAlchemyError

from celery_saga.definition.builder import SagaDefinition
from celery_saga.errors import PayloadKeyError
from celery_saga.records import Attempt, Direction
from celery_saga.runtime.holders import ClaimKind, attempt_running
from celery_saga.runtime.moves import Move, Stay
from celery_saga.runtime.outcomes import Interrupted, Outcome, no_body_if_taken_over
from celery_saga.runtime.parts import Parts
from celery_saga.runtime.stopping import give_up, worker_is_stopping
from celery_saga.tracing.spans import AttemptSpan


class AttemptBody(Protocol):
    """One direction's side of a claimed attempt."""

    @property
    def held(self) -> Attempt:
        """The attempt, as claimed."""

    @property
    def compensatable(self) -> bool | None:
        """As its claim stored it (a step's; None for a reversal)."""

    @property
    def label(self) -> str:
        """How log lines name it: "step 'x'", "the reversal of step 'x'"."""

    @property
    def definition(self) -> SagaDefinition:
        """The definition its run runs on."""

    @property
    def span(self) -> AttemptSpan:
        """Its span in the run's trace (``celery_saga.tracing``), begun before its claim."""

    def context(self) -> Any:
        """The context its body sees."""

    def call(self, ctx: Any) -> Any:
        """Run the body (and encode what it returned)."""

    def succeeded(self, result: Any) -> tuple[Outcome, Move]:
        """Record the body's result (under the lease); the move that follows."""

    def failed(self, error: BaseException) -> tuple[Outcome, Move]:
        """Retry, or record the failure for good; the move that follows."""

    def give_up_claim(self) -> bool:
        """End the claim's lease (only while it is still this attempt's)."""

    def send_again(self) -> None:
        """Send the attempt's message again, to run at once elsewhere."""


def attempt_fields(definition: SagaDefinition, held: Attempt, key: str) -> dict[str, Any]:
    """The fields every event about an attempt carries (``key``: its idempotency key)."""
    return {
        "execution_id": held.execution_id,
        "saga": definition.name,
        "step": held.name,
        "attempt": held.attempt,
        "idempotency_key": key,
    }


def run_attempt(parts: Parts, body: AttemptBody) -> tuple[Outcome, Move]:
    """Run ``body``'s claimed attempt; returns its outcome and the move that follows.

    This frame is the caller of one on the body's traceback: it keeps no outcome (see
    ``carried_out``), which ``_ended`` records on the span."""
    return _ended(body.span, _run_attempt(parts, body, body.span))


def run_and_carry_out(
    parts: Parts, body: AttemptBody, carry_out: Callable[[Move], None]
) -> Outcome:
    """Run ``body``'s claimed attempt and carry out its move, in the attempt's span of the
    run's trace: the log lines about it and the messages it leads to are in that span."""
    with body.span.running(body.held.attempt):
        return carried_out(carry_out, run_attempt(parts, body))


def _run_attempt(parts: Parts, body: AttemptBody, span: AttemptSpan) -> tuple[Outcome, Move]:
    held = body.held
    forward = held.direction is Direction.FORWARD
    kind: ClaimKind = "step" if forward else "reversal"
    db = parts.db if forward else None  # a step's body may ask whether its run was cancelled
    renew = parts.renewals.of(held, body.compensatable)
    with (
        parts.holding(renew, f"{body.label} of execution {held.execution_id}"),
        attempt_running(
            kind, held.execution_id, held.name, held.attempt, db=db, holder=held.holder
        ),
    ):
        try:
            ctx = body.context()
        except (SQLAlchemyError, PayloadKeyError):
            raise  # the store (or a key) failed, not the attempt: the claim waits its lease
        except Exception as error:  # e.g. the soft time limit, spent before the body
            return _before_the_body(_failed(body, span, error))
        try:
            result = body.call(ctx)
        except (Exception, SystemExit) as error:
            # Everything the body does counts as its attempt, ``sys.exit()`` included: an
            # error here must settle it, or the run would wait for its lease. Only the
            # worker's own shutdown is not the attempt's (given up once the heartbeat has
            # stopped, below).
            if not worker_is_stopping(error):
                return _failed(body, span, error)
            stopped = error
        else:
            return body.succeeded(result)
    return _interrupted(body, stopped), Stay()


def carried_out(carry_out: Callable[[Move], None], ran: tuple[Outcome, Move]) -> Outcome:
    """Carry out what an attempt led to (``ran``: its outcome and move); its outcome.

    Only this frame holds the outcome: the caller's frame outlives the attempt as the
    caller of a frame on the body's traceback, and an outcome kept in it (which holds what
    the body raised) would close a cycle that only a full garbage collection frees
    (tests/test_failure_memory.py)."""
    carry_out(ran[1])
    return ran[0]


def _ended(span: AttemptSpan, ran: tuple[Outcome, Move]) -> tuple[Outcome, Move]:
    span.ended(ran[0])
    return ran


def _failed(body: AttemptBody, span: AttemptSpan, error: BaseException) -> tuple[Outcome, Move]:
    """``body.failed``, then the error (scrubbed by it of the run's secrets) on the span."""
    ran = body.failed(error)
    span.failed(error)
    return ran


def _before_the_body(ran: tuple[Outcome, Move]) -> tuple[Outcome, Move]:
    """An attempt that failed before its body ran (its outcome kept out of the frame that
    caught the error, as in ``carried_out``)."""
    return no_body_if_taken_over(ran[0]), ran[1]


def _interrupted(body: AttemptBody, error: BaseException) -> Interrupted:
    """The worker's shutdown cut the body short: record nothing, give the claim up and
    send the message again, so the next worker runs it at once. The attempt still counts
    (guarantee 27: at most ``retry + 1`` whatever ends them)."""
    held = body.held
    what = f"{body.label} attempt {held.attempt}"
    where = f"saga {body.definition.name!r} execution {held.execution_id}"
    return Interrupted(give_up(body.give_up_claim, body.send_again, where, what), error)
