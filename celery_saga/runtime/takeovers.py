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

from celery_saga.decisions.lost_claims import ClaimState
from celery_saga.decisions.takeover import Answer, Takeover, decide_takeover
from celery_saga.records import Attempt, Direction
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.heartbeat import LeaseState
from celery_saga.runtime.holders import HeldClaim, Holders
from celery_saga.runtime.lost_claims import LostClaims
from celery_saga.store import claims, history
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
    """Lease renewals that say why a renewal did not land (``LeaseState``), and write back
    a claim the store lost (``LostClaims``)."""

    def __init__(self, db: Database, lost: LostClaims) -> None:
        self.db, self.lost = db, lost

    def of(
        self, held: Attempt, compensatable: bool | None = None
    ) -> Callable[[datetime], LeaseState]:
        """Renew ``held``'s lease, either direction. ``compensatable`` (a step's): as the
        claim stored it; None where it is not known (a lost claim is then left to the
        body's own heartbeat to write back)."""

        def renew(expiry: datetime) -> LeaseState:
            if claims.renew(self.db, held, lease_expires_at=expiry):
                return LeaseState.HELD
            match held.direction:
                case Direction.FORWARD:
                    return _lease_state(self.lost.step(held, compensatable))
                case Direction.REVERSE:
                    return _lease_state(self.lost.reversal(held))

        return renew


def _lease_state(state: ClaimState) -> LeaseState:
    if state is ClaimState.TAKEN:
        return LeaseState.TAKEN
    if state is ClaimState.ENDED:
        return LeaseState.ENDED
    # HELD, RESTORED, or LOST and not written back from here (what the claim stored is not
    # known in a worker's main process; the body's own heartbeat writes it back): kept, and
    # the next renewal asks again.
    return LeaseState.HELD


def keep_late_outcome(
    db: Database,
    execution_id: str,
    what: str,
    step: str,
    attempt: int,
    key: str,
    blob: bytes | None,
    holder: str | None,
    taken: bool = True,
) -> None:
    """A body finished after its claim was taken over (``taken``), or after its step was no
    longer owed to it: say which once, and keep its outcome on the run's history (best
    effort: the store may be what cut it off)."""
    why = "its claim was taken over" if taken else "its step was no longer owed to it"
    logger.warning(
        "execution %s: %s attempt %d finished after %s; its outcome is kept on the run's "
        "history, not recorded as the step's (idempotency key %s)",
        execution_id,
        what,
        attempt,
        why,
        key,
    )
    entry = history.HistoryEntry(
        at=get_clock().now(),
        kind="late-outcome",
        step=step,
        attempt=attempt,
        holder=holder,
        detail=f"{what} attempt {attempt} finished after {why}",
    )
    try:
        history.append(db, execution_id, entry, blob)
    except Exception as error:
        logger.warning("execution %s: the late outcome could not be kept: %r", execution_id, error)
