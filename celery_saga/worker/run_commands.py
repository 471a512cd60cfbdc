"""Public calls that act on a stored run by its id: ``engine.cancel`` (guarantee 31),
``signal`` and ``resume_compensation``, and ``start`` meeting an id that is taken
(guarantee 28).

A run continues only on the version it started with (guarantee 22). A process without
that version (a web process deployed with newer code, an operator's shell) does not refuse
a signal, a resume or a cancel: it checks what it can (the run exists, the input is
valid), then hands the call on as a ``celery_saga.command`` message that a worker with
the version carries out (``carry_out``); a worker without it hands the message back like
any other message of the run.
"""

from __future__ import annotations

import base64
import logging
from typing import TYPE_CHECKING, Any

from celery_saga.decisions.cancel import CancelVerdict
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import PivotNode
from celery_saga.errors import (
    ExecutionNotFoundError,
    InvalidStateError,
    SagaError,
    VersionNotDeployedError,
)
from celery_saga.limits import check_lookup_id
from celery_saga.records import ExecutionRecord, ExecutionState
from celery_saga.runtime.outcomes import NoBody
from celery_saga.store import queries
from celery_saga.store.codec import pack, unpack
from celery_saga.store.operator_exits import require_stuck

if TYPE_CHECKING:
    from celery_saga.worker.engine import SagaEngine

logger = logging.getLogger("celery_saga")

#: What a cancel that changed nothing says.
NO_OP = {
    CancelVerdict.ALREADY_CANCELLED: "is already cancelled; nothing changed",
    CancelVerdict.UNWINDING: (
        "is unwinding already; its compensations are never interrupted, nothing changed"
    ),
}


def check_actor(actor: str | None) -> None:
    """An actor is a name (``user@host``, a web user), recorded in the run's history."""
    if actor is not None and not isinstance(actor, str):
        raise SagaError(f"an actor is text (who acts), got {type(actor).__name__}")


def cancel_run(
    engine: SagaEngine, execution_id: str, reason: str | None, actor: str | None = None
) -> CancelVerdict:
    """Cancel a run (see ``SagaEngine.cancel``)."""
    check_lookup_id(execution_id)
    check_actor(actor)
    if reason is not None and not isinstance(reason, str):
        raise SagaError(f"a cancel reason is text, got {type(reason).__name__}")
    engine.ensure_schema()

    def cancel() -> CancelVerdict:
        record = queries.load_execution(engine.db, execution_id)
        if record is None or record.id != execution_id:
            raise ExecutionNotFoundError(f"no saga execution with id {execution_id!r}")
        definition = engine.catalog.known(record.saga_name, record.definition_hash)
        # hands on if missing
        verdict = engine.executor.cancel(record, reason, actor)
        if verdict is CancelVerdict.ENDED:  # it may have ended just now: say how
            record = queries.load_execution(engine.db, execution_id) or record
        _refuse(verdict, record, definition)
        return verdict

    return engine._store(f"cancelling {execution_id!r}", cancel)


def _refuse(
    verdict: CancelVerdict, record: ExecutionRecord, definition: SagaDefinition | None
) -> None:
    what = f"execution {record.id!r} of saga {record.saga_name!r}"
    if verdict is CancelVerdict.PAST_PIVOT:
        pivot = pivot_name(definition) if definition else "its version is not here to name it"
        raise InvalidStateError(
            f"{what} has passed its pivot ({pivot}), the point of no return: it cannot be cancelled"
        )
    if verdict is CancelVerdict.ENDED:
        raise InvalidStateError(
            f"{what} has already ended ({record.state.value}): it cannot be cancelled"
        )


def pivot_name(definition: SagaDefinition) -> str:
    """The pivot as an operator knows it: after which step it stands."""
    before = None
    for node in definition.nodes:
        if isinstance(node, PivotNode):
            return f"the pivot after step {before!r}" if before else "the pivot"
        name = getattr(node, "name", None) or getattr(getattr(node, "step", None), "name", None)
        before = name or before
    return "the pivot"


def adopt(
    engine: SagaEngine, definition: SagaDefinition, saga_input: Any, execution_id: str
) -> None:
    """``start`` with an id that is taken: the same saga and input is the same run
    (a caller retrying, or our own INSERT whose reply was lost), anything else an error.
    A run that has not moved yet gets its first message again; admission drops the
    spare if the first one was sent (guarantee 28)."""
    existing = engine._store(
        "reading an existing execution",
        lambda: queries.load_snapshot(engine.db, execution_id),
    )
    record, steps = existing
    if (
        record is None
        or record.id != execution_id  # MySQL finds 'a1' for 'A1'
        or record.saga_name != definition.name
        or record.input != unpack(pack(saga_input, limit=engine.settings.max_payload_bytes))
    ):
        raise SagaError(
            f"an execution with id {execution_id!r} already exists with a different saga "
            "or input; start it with another id"
        )
    if record.state is ExecutionState.RUNNING and not steps:
        engine._launch(definition, execution_id, announce=False)


def signal_run(
    engine: SagaEngine, execution_id: str, event: str, payload: Any, actor: str | None = None
) -> bool:
    """``engine.signal``: record it here, or hand it on (returning False) when this
    process lacks the run's version."""
    if not isinstance(event, str) or not event:
        raise SagaError(f"a signal needs an event name, got {event!r}")
    check_actor(actor)
    try:
        definition = engine._definition_of(execution_id)
    except VersionNotDeployedError as missing:
        blob = pack(
            payload,
            what=f"payload of signal {event!r} for execution {execution_id!r}",
            limit=engine.settings.max_payload_bytes,
        )
        encoded = base64.b64encode(blob).decode("ascii")
        engine.publisher.hand_on(
            missing, execution_id, "signal", event=event, payload=encoded, actor=actor
        )
        return False
    return engine._store(
        f"signalling {event!r} to {execution_id!r}",
        lambda: engine.executor.signal(definition, execution_id, event, payload, actor),
    )


def resume_run(engine: SagaEngine, execution_id: str, actor: str | None = None) -> None:
    """``engine.resume_compensation``: here, or handed on when this process lacks the
    run's version (only a run whose unwind is parked is resumed, checked here first)."""
    check_actor(actor)
    try:
        definition = engine._definition_of(execution_id)
    except VersionNotDeployedError as missing:
        engine._store(
            f"reading the unwind of {execution_id!r}",
            lambda: require_stuck(engine.db, execution_id, "resume_compensation"),
        )
        engine.publisher.hand_on(missing, execution_id, "resume", actor=actor)
        return
    engine._store(
        f"resuming the unwind of {execution_id!r}",
        lambda: engine.executor.unwinder.resume(definition, execution_id, actor),
    )


def abandon_run(
    engine: SagaEngine, execution_id: str, actor: str | None, reason: str | None
) -> int:
    """``engine.abandon_compensation``: only where the run's version is registered."""
    check_actor(actor)
    if reason is not None and not isinstance(reason, str):
        raise SagaError(f"an abandon reason is text, got {type(reason).__name__}")
    definition = engine._definition_of(execution_id)
    return engine._store(
        f"abandoning the unwind of {execution_id!r}",
        lambda: engine.executor.unwinder.abandon(definition, execution_id, actor, reason),
    )


def carry_out(
    engine: SagaEngine, execution_id: str, command: str, arguments: dict[str, Any]
) -> NoBody:
    """A worker's side of a handed-on call (the message's version is registered here:
    ``COMMAND_TASK`` checked it). What the run refuses now is logged: its caller is gone."""
    try:
        if command == "signal":
            payload = unpack(base64.b64decode(arguments["payload"]))
            actor = arguments.get("actor")  # absent from a message of an older release
            signal_run(engine, execution_id, arguments["event"], payload, actor)
        elif command == "resume":
            resume_run(engine, execution_id, arguments.get("actor"))
        elif command == "cancel":
            record = queries.load_execution(engine.db, execution_id)
            if record is not None:
                engine.executor.continue_cancel(record)
        else:
            raise SagaError(f"unknown command {command!r} (sent by a newer release?)")
    except VersionNotDeployedError:
        raise  # moved to another version meanwhile: handed back for a worker with it
    except SagaError as refused:
        logger.error(
            "execution %s: the %s handed on by a process without its version was refused: %s",
            execution_id,
            command,
            refused,
        )
        return NoBody(f"{command} refused: {refused}")
    return NoBody(f"{command} carried out")
