"""The moves a bulk operation can make (``engine.bulk``), as one registry: ``MOVES``. A new
move is one ``BulkMove`` here: the states it acts on when the filter names none, and the
engine call that makes it on one run (``run_commands``' and ``held_moves``' calls)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from celery_saga.decisions.cancel import CANCELLABLE_STATES, CancelVerdict
from celery_saga.definition.builder import SagaDefinition
from celery_saga.errors import SagaError
from celery_saga.records import Execution, ExecutionState
from celery_saga.store.database import Database
from celery_saga.typed_payload import parse_payload
from celery_saga.worker import held_moves, run_commands
from celery_saga.worker.parts import WorkerParts


class SagaEngine(Protocol):
    """What a bulk operation uses of the engine: its store, its parts (the moves on one run
    are ``run_commands``' and ``held_moves``' calls on them) and its upgrade."""

    db: Database
    parts: WorkerParts

    def get(self, execution_id: str) -> Execution: ...
    def upgrade(
        self, execution_id: str, to: str | None = None, *, actor: str | None = None
    ) -> SagaDefinition: ...


#: The engine call that makes a move on one run: (engine, run id, actor, reason, options)
#: -> True if it moved the run, False if the run needed nothing; raises its refusal.
Act = Callable[[SagaEngine, str, str, "str | None", Mapping[str, Any]], bool]

_LIVE = (ExecutionState.RUNNING, ExecutionState.WAITING, ExecutionState.HELD)
_PARKED = (ExecutionState.COMPENSATION_STUCK,)
_HELD = (ExecutionState.HELD,)


@dataclass(frozen=True)
class BulkMove:
    """A move a bulk operation can make: ``states``, the runs it acts on when the filter
    names no state, and ``act``, the engine's call on one run."""

    name: str
    states: tuple[ExecutionState, ...]
    act: Act
    #: The options it needs (``engine.bulk(..., step=..., note=...)``), checked before.
    needs: tuple[str, ...] = ()
    #: Options given as text that are read as a value (a skip's JSON ``result``): each is
    #: parsed before the operation is stored, so a bad one is refused with nothing stored.
    parsed: tuple[str, ...] = ()


def _moves_or_raises(
    call: Callable[[WorkerParts, str, str, str | None], object],
) -> Act:
    """A move whose call (``parts, run, actor, reason``) moves the run or raises."""

    def act(
        engine: SagaEngine, run: str, actor: str, reason: str | None, options: Mapping[str, Any]
    ) -> bool:
        call(engine.parts, run, actor, reason)
        return True

    return act


def _cancel(
    engine: SagaEngine, run: str, actor: str, reason: str | None, options: Mapping[str, Any]
) -> bool:
    return run_commands.cancel_run(engine.parts, run, reason, actor) is CancelVerdict.CANCEL


def _resume(
    engine: SagaEngine, run: str, actor: str, reason: str | None, options: Mapping[str, Any]
) -> bool:
    run_commands.resume_run(engine.parts, run, actor)
    return True


def _upgrade(
    engine: SagaEngine, run: str, actor: str, reason: str | None, options: Mapping[str, Any]
) -> bool:
    engine.upgrade(run, options.get("to"), actor=actor)
    return True


def _resolve(
    engine: SagaEngine, run: str, actor: str, reason: str | None, options: Mapping[str, Any]
) -> bool:
    run_commands.resolve_run(engine.parts, run, options["step"], options["note"], actor)
    return True


def _skip(
    engine: SagaEngine, run: str, actor: str, reason: str | None, options: Mapping[str, Any]
) -> bool:
    result = options.get("result")
    value = None if result is None else parse_payload(result)
    held_moves.skip_run(engine.parts, run, value, actor, reason)
    return True


#: Every move a bulk operation can make, by the name the CLI and ``engine.bulk`` take.
MOVES: dict[str, BulkMove] = {
    move.name: move
    for move in (
        BulkMove("cancel", CANCELLABLE_STATES, _cancel),
        BulkMove("resume", _PARKED, _resume),
        BulkMove("abandon", _PARKED, _moves_or_raises(run_commands.abandon_run)),
        BulkMove("upgrade", (*_LIVE, ExecutionState.COMPENSATING, *_PARKED), _upgrade),
        BulkMove("resolve", _PARKED, _resolve, needs=("step", "note")),
        BulkMove("retry", _HELD, _moves_or_raises(held_moves.retry_run)),
        BulkMove("skip", _HELD, _skip, parsed=("result",)),
        BulkMove("unwind", _HELD, _moves_or_raises(held_moves.unwind_run)),
    )
}


def bulk_move(name: str) -> BulkMove:
    move = MOVES.get(name)
    if move is None:
        raise SagaError(f"unknown bulk move {name!r:.40}; moves: {', '.join(MOVES)}")
    return move
