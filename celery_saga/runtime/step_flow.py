"""Step flow control in the runtime (guarantee 37): a step with ``concurrency=`` or
``rate=`` passes its key's door before its claim. A step that cannot start keeps no worker
slot: its message is acked, and sent again when a slot frees (by the attempt that frees it,
or by the next door of the key) or at its booked turn. The writes are
``store/step_flow.py``'s; a message they owe that is lost is the recovery sweep's to send.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from celery_saga.decisions.admission import NodeMessage
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.flow import key_of
from celery_saga.definition.hashing import callable_identity
from celery_saga.definition.nodes import StepSpec
from celery_saga.errors import SagaError
from celery_saga.records import ExecutionRecord
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.moves import FailRun, Move, Moves, PublishNode, Stay
from celery_saga.runtime.navigation import Position
from celery_saga.runtime.parts import Parts
from celery_saga.store import step_flow, step_lines
from celery_saga.store.step_flow import StepDoor

logger = logging.getLogger("celery_saga")


def is_limited(spec: StepSpec | None) -> bool:
    """The step passes a door before its claim (it has ``concurrency=`` or ``rate=``)."""
    return spec is not None and (spec.concurrency is not None or spec.rate is not None)


@dataclass(frozen=True)
class DoorAnswer:
    """What a door said: ``go`` (the step claims now), what to carry out (the messages it
    owes to waiters it woke, or this step's own deferral) and, when it waits, why."""

    go: bool
    moves: Move
    why: str = ""


@dataclass(frozen=True)
class StepFlow:
    """The doors of limited steps, in front of their claims."""

    parts: Parts

    def door(
        self,
        definition: SagaDefinition,
        position: Position,
        message: NodeMessage,
        execution: ExecutionRecord,
    ) -> StepDoor | DoorAnswer:
        """The step's place at its key's door; a key that cannot be made fails the run."""
        spec = position.spec
        assert spec is not None
        limit = spec.concurrency or spec.rate
        assert limit is not None
        try:
            key = key_of(definition.name, limit, execution.input)
        except SagaError as error:
            at = (message.node, message.sub)
            return DoorAnswer(False, FailRun(definition, execution.id, str(error), at), "no key")
        return StepDoor(
            message.execution_id,
            position.record_name,
            definition.name,
            definition.hash,
            callable_identity(spec.action),
            key,
            message.node,
            message.sub,
            message.member,
            message.attempt,
        )

    def enter(
        self, definition: SagaDefinition, spec: StepSpec, door: StepDoor, message: NodeMessage
    ) -> DoorAnswer:
        """Pass ``door``: a slot or a due turn (go), or wait without a worker slot."""
        now, db = get_clock().now(), self.parts.db
        if spec.rate is not None:
            turn = step_flow.take_turn(db, door, 1 / spec.rate.per_second, get_clock().now)
            if turn.go:
                time.sleep(turn.sleep)  # at most two turns of the rate: a moment
                return DoorAnswer(True, Stay())
            why = f"its turn of the rate of key {door.key!r}"
            if turn.countdown is None:  # early: the message sent for its turn waits
                return DoorAnswer(False, Stay(), why)
            logger.info(
                "saga %r execution %s: step %r waits %.3f s for its turn (rate %s of key %r); "
                "no worker slot held",
                definition.name,
                door.execution_id,
                door.record,
                turn.countdown,
                spec.rate.spec,
                door.key,
            )
            again = PublishNode(definition, message, spec=spec, countdown=turn.countdown)
            return DoorAnswer(False, again, why)
        assert spec.concurrency is not None
        verdict = step_flow.enter(db, door, spec.concurrency.max, now, self.parts.lease)
        woken = self._woken(verdict.woken)
        if verdict.go:
            return DoorAnswer(True, woken)
        logger.info(
            "saga %r execution %s: step %r waits for a slot of key %r (all %d held, or "
            "owed to steps that came first); no worker slot held",
            definition.name,
            door.execution_id,
            door.record,
            door.key,
            spec.concurrency.max,
        )
        return DoorAnswer(False, woken, f"a slot of key {door.key!r}")

    def leave(self, spec: StepSpec, door: StepDoor) -> Move:
        """The step's attempt is over at its door: its slot given back (unless its record
        still runs) and the waiters it frees owed their messages. A store that cannot be
        reached leaves them to the next door of the key or the recovery sweep."""
        if spec.concurrency is None:
            return Stay()
        now, limit = get_clock().now(), spec.concurrency.max
        try:
            woken = step_flow.leave(self.parts.db, door, limit, now, self.parts.lease)
        except Exception as error:  # the attempt's own outcome stands; the grant expires
            logger.warning(
                "step %r of execution %s: its slot of key %r could not be given back (%s); "
                "it frees a lease from now",
                door.record,
                door.execution_id,
                door.key,
                error,
            )
            return Stay()
        return self._woken(woken)

    def sweep_lines(self, now: datetime, stale_after: timedelta, page: int = 100) -> Move:
        """For the recovery sweep: a pass of the free slots of each key whose line has not
        moved for ``stale_after`` (a pass that should have granted them was lost with its
        worker or its store connection); the messages owed to the waiters it grants."""
        db, lease, moves = self.parts.db, self.parts.lease, []
        for door in step_lines.stale_lines(db, now - stale_after, page):
            definition = self.parts.registry.known(door.saga, door.version)
            spec = definition.find_step(door.record) if definition else None
            if spec is None or spec.concurrency is None:
                continue  # a process with the waiter's version passes its line
            granted = step_flow.wake(db, door, spec.concurrency.max, now, lease)
            if granted:
                logger.info(
                    "step %r: %d waiter(s) of key %r granted a free slot by the recovery "
                    "sweep (a pass of the key's line was lost)",
                    door.record,
                    len(granted),
                    door.key,
                )
            moves.append(self._woken(granted))
        return Moves(tuple(moves))

    def _woken(self, doors: list[StepDoor]) -> Move:
        """The messages owed to waiters granted a slot."""
        moves: list[Move] = []
        for each in doors:
            definition = self.parts.registry.known(each.saga, each.version)
            if definition is None:
                logger.warning(
                    "saga %r execution %s: step %r was granted a slot of key %r, but this "
                    "process lacks its version %s: the recovery sweep sends its message",
                    each.saga,
                    each.execution_id,
                    each.record,
                    each.key,
                    each.version[:12],
                )
                continue
            spec = definition.find_step(each.record)
            message = NodeMessage(each.execution_id, each.node, each.sub, each.member, each.attempt)
            moves.append(PublishNode(definition, message, spec=spec))
        return Moves(tuple(moves)) if moves else Stay()
