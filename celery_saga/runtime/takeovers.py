"""Taking over a claim only on its holder's word, and keeping a late body's outcome.

``judge`` asks a claim's holder (``Holders.ask``) and applies ``decide_takeover``, leaving one
log line for each decision it takes on its own. ``Renewals`` tells a lease that was taken
over from one whose attempt simply ended, so the heartbeat and the holder's worker only
speak of a takeover when there was one. ``keep_late_outcome`` records, on the run's
history, the result of a body that finished after its claim had been taken over
(guarantee 30): the next attempt's owner can see what the first one did.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from celery_saga.decisions.takeover import Answer, Takeover, decide_takeover
from celery_saga.records import ReversalAttempt, StepAttempt
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.heartbeat import LeaseState
from celery_saga.runtime.holders import HeldClaim, Holders
from celery_saga.store import forward, history, queries, unwind
from celery_saga.store.database import Database

logger = logging.getLogger("celery_saga")


def judge(holders: Holders, claim: HeldClaim) -> tuple[Takeover, Answer]:
    """Whether ``claim`` may be taken over, on what its holder answers (and the answer,
    for ``taken_over`` to tell once the claim has really been taken)."""
    answer = Answer.NO_CHANNEL if claim.holder is None else holders.ask(claim)
    takeover = decide_takeover(claim.lease_live, answer)
    if takeover is Takeover.LEAVE:
        what = _describe(claim)
        logger.info("%s: left to its holder %s (it answered %s)", what, claim.holder, answer.value)
    return takeover, answer


def taken_over(claim: HeldClaim, answer: Answer) -> None:
    """One line once a claim was taken over: only then, since the claim may still go to
    someone else (or to the holder's own outcome, landing a moment before)."""
    what = _describe(claim)
    if answer is Answer.STOPPED:
        logger.warning(
            "%s: its holder %s could not reach the store and stopped the body; it runs again here",
            what,
            claim.holder,
        )
    elif claim.holder is not None:
        logger.warning(
            "%s: taken over from %s, which %s",
            what,
            claim.holder,
            "no longer runs it" if answer is Answer.ABSENT else f"answered {answer.value}",
        )


def _describe(claim: HeldClaim) -> str:
    what = "step" if claim.kind == "step" else "reversal of step"
    return f"execution {claim.execution_id}: {what} {claim.name!r} attempt {claim.attempt}"


class Renewals:
    """Lease renewals that say why a renewal did not land (``LeaseState``)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def of_step(self, step: StepAttempt) -> Callable[[datetime], LeaseState]:
        def renew(expiry: datetime) -> LeaseState:
            if forward.renew_step_lease(self.db, step, lease_expires_at=expiry):
                return LeaseState.HELD
            record = queries.load_step(self.db, step.execution_id, step.name)
            taken = record is not None and record.attempts > step.attempt
            return LeaseState.TAKEN if taken else LeaseState.ENDED

        return renew

    def of_reversal(self, reversal: ReversalAttempt) -> Callable[[datetime], LeaseState]:
        def renew(expiry: datetime) -> LeaseState:
            if unwind.renew_compensation_lease(self.db, reversal, lease_expires_at=expiry):
                return LeaseState.HELD
            record = queries.load_step(self.db, reversal.execution_id, reversal.name)
            taken = record is not None and record.compensation_attempts > reversal.attempt
            return LeaseState.TAKEN if taken else LeaseState.ENDED

        return renew


def keep_late_outcome(
    db: Database,
    execution_id: str,
    what: str,
    step: str,
    attempt: int,
    key: str,
    blob: bytes | None,
    holder: str | None,
) -> None:
    """A body finished after its claim was taken over: say so once, and keep its outcome
    on the run's history (best effort: the store may be what cut it off)."""
    logger.warning(
        "execution %s: %s attempt %d finished after its claim was taken over; its outcome "
        "is kept on the run's history, not recorded as the step's (idempotency key %s)",
        execution_id,
        what,
        attempt,
        key,
    )
    entry = history.HistoryEntry(
        at=get_clock().now(),
        kind="late-outcome",
        step=step,
        attempt=attempt,
        holder=holder,
        detail=f"{what} attempt {attempt} finished after its claim was taken over",
    )
    try:
        history.append(db, execution_id, entry, blob)
    except Exception as error:
        logger.warning("execution %s: the late outcome could not be kept: %r", execution_id, error)
