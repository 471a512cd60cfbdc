"""The engine's calls on runs, outside any message: store and launch a run, record a
signal, cancel a run (or every run past its deadline), fire the waits whose deadline
passed. Each asks a helper, and the interpreter carries out the move it returns."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from celery_saga.decisions.cancel import CancelVerdict
from celery_saga.definition.builder import SagaDefinition
from celery_saga.errors import SagaError
from celery_saga.records import ExecutionRecord
from celery_saga.runtime import forward_moves
from celery_saga.runtime.cancel import DEADLINE
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.holds import HOLD_TIMEOUT_ACTOR, Holds
from celery_saga.runtime.interpreter import Interpreter
from celery_saga.runtime.moves import Move, MoveOn, Stay
from celery_saga.runtime.parts import Parts
from celery_saga.runtime.pauses import Pauses
from celery_saga.runtime.waits import Waits
from celery_saga.store import queries, waits
from celery_saga.tracing.carry import carrying

logger = logging.getLogger("celery_saga")


class EngineCalls:
    """What the engine asks of the runtime about a run, as opposed to a message's work."""

    def __init__(self, parts: Parts, interpreter: Interpreter, gates: Waits) -> None:
        self.parts, self.interpreter, self.waits = parts, interpreter, gates
        self.carry_out, self.cancellation = interpreter.carry_out, interpreter.cancellation
        self.holds = Holds(parts)
        self.pauses = Pauses(parts)
        #: Store a new run (see ``forward_moves.create``).
        self.create = functools.partial(forward_moves.create, parts)

    def launch(self, definition: SagaDefinition, execution_id: str, **options: Any) -> None:
        """Send the first message of a stored run (see ``forward_moves.launch``)."""
        self.carry_out(forward_moves.launch(self.parts, definition, execution_id, **options))

    def continue_cancel(self, execution: ExecutionRecord) -> None:
        """Begin a cancelled run's unwind once nothing of it is going (guarantee 31)."""
        cancellation = self.cancellation
        self.carry_out(
            cancellation.resume_cancel(self.parts.definition_of(execution), execution.id)
        )

    def cancel(
        self, execution: ExecutionRecord, reason: str | None, actor: str | None = None
    ) -> CancelVerdict:
        """Cancel ``execution`` (see ``Cancellation.cancel``); returns what was done."""
        verdict, move = self.cancellation.cancel(execution, reason, actor)
        self.carry_out(move)
        return verdict

    def cancel_overdue(self, page: int = 200) -> int:
        """Cancel every run whose deadline has passed (the timer sweep); returns how many."""
        cancellation, acted = self.cancellation, 0
        for execution_id in cancellation.overdue(page):
            execution = queries.load_execution(self.parts.db, execution_id)
            if execution is None:
                continue
            traced = execution.trace_context  # a span of the run's trace, as a cancel's
            with self.parts.tracer.action("cancel", execution_id, None, traced):
                verdict = self.cancel(execution, DEADLINE)
            if verdict is CancelVerdict.CANCEL:
                acted += 1
            else:
                cancellation.not_cancelled(execution_id, verdict)
        return acted

    def fire_timers(self, page: int = 200, most: int = 10_000) -> int:
        """Fire every wait whose deadline passed (see ``Waits.expire``); returns how many
        runs were moved. Safe with several sweepers at once."""
        now = get_clock().now()
        acted = seen = 0
        after = None
        while seen < most:
            rows = waits.list_expired_waits(self.parts.db, now=now, limit=page, after=after)
            for row in rows:
                try:
                    with carrying(row.trace_context):  # its messages stay in its trace
                        move = self.waits.expire(row, now)
                        self.carry_out(move)
                    acted += not isinstance(move, Stay)
                except Exception:
                    logger.exception("the deadline of execution %s could not be fired", row.id)
            seen += len(rows)
            if len(rows) < page:
                break
            after = (rows[-1].wake_at, rows[-1].id)
        return acted

    def move_held(self, move: Callable[[Holds], Move]) -> None:
        """Carry out ``move`` of a held run (``Holds.retry``, ``skip`` or ``unwind``)."""
        self.carry_out(move(self.holds))

    def release_paused(
        self, definition: SagaDefinition, execution_id: str, actor: str | None, reason: str | None
    ) -> bool:
        """Release a run held at a paused step's door (see ``Pauses.release``); False: it
        was released already, or moved meanwhile."""
        released = self.pauses.release(definition, execution_id, actor, reason)
        if released is None:
            return False
        move, fresh = released
        self.carry_out(move)
        return fresh

    def unwind_expired_holds(self, page: int = 200) -> int:
        """Unwind every held run whose hold timeout has passed (the timer sweep); returns how
        many."""
        return sum(self.expire_hold(execution_id) for execution_id in self.holds.expired(page))

    def expire_hold(self, execution_id: str) -> bool:
        """Unwind one held run whose hold timeout has passed; False: it was moved meanwhile
        (an operator, a cancel) and is left as that move left it."""
        execution = queries.load_execution(self.parts.db, execution_id)
        if execution is None:
            return False
        try:
            definition = self.parts.definition_of(execution)
            why = "no operator moved it within its hold timeout"
            move = self.holds.unwind(definition, execution_id, HOLD_TIMEOUT_ACTOR, why, due=True)
        except SagaError as refused:
            logger.info("execution %s: hold timeout not fired: %s", execution_id, refused)
            return False
        self.carry_out(move)
        return True

    def signalled(self, move: Move) -> bool:
        """Carry out what a signal led to (``Waits.signal``); True if it resumed the run
        parked at its gate."""
        self.carry_out(move)
        return isinstance(move, MoveOn)
