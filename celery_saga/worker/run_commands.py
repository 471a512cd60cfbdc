"""The operator's commands on a stored run, one function each, with their handed-on side:
``engine.start`` (and an id that is taken, guarantee 28), ``cancel`` (guarantee 31),
``signal``, ``resume_compensation``, ``resolve`` and ``abandon_compensation``.

A run continues only on the version it started with (guarantee 22). A process without
that version (a web process deployed with newer code, an operator's shell) does not refuse
a signal, a resume or a cancel: it checks what it can (the run exists, the input is
valid), then hands the call on as a ``celery_saga.command`` message that a worker with
the version carries out (``carry_out``, through ``HANDED_ON``); a worker without it hands
the message back like any other message of the run. A new command is one function here,
one entry in ``HANDED_ON`` if it may be handed on, and the engine's public method.

With a payload codec configured, a handed-on command's arguments (its payload and its
actor) travel sealed with the run and the command (``sealed_commands``): a worker refuses
one that is not, with a WARNING line, and does nothing.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from sqlalchemy.exc import IntegrityError

from celery_saga.decisions.cancel import CancelVerdict
from celery_saga.definition.builder import SagaDefinition, run_timeout
from celery_saga.errors import (
    ExecutionNotFoundError,
    InvalidStateError,
    SagaError,
    VersionNotDeployedError,
)
from celery_saga.ids import new_execution_id
from celery_saga.limits import check_lookup_id, checked_labels
from celery_saga.records import ExecutionRecord, ExecutionState
from celery_saga.runtime.outcomes import NoBody
from celery_saga.store import queries
from celery_saga.store.codec import pack, unpack
from celery_saga.store.operator_exits import require_resolvable, require_stuck
from celery_saga.worker import held_moves, pause_moves
from celery_saga.worker.arguments import check_actor, check_reason
from celery_saga.worker.parts import WorkerParts
from celery_saga.worker.run_lookup import pivot_name, run_of
from celery_saga.worker.sealed_commands import UnsealedCommand, open_arguments
from celery_saga.worker.start_checks import refuse_before_start

logger = logging.getLogger("celery_saga")

#: What a cancel that changed nothing says.
NO_OP = {
    CancelVerdict.ALREADY_CANCELLED: "is already cancelled; nothing changed",
    CancelVerdict.UNWINDING: (
        "is unwinding already; its compensations are never interrupted, nothing changed"
    ),
}


# -- start ------------------------------------------------------------------------------
def start_run(
    parts: WorkerParts,
    definition: SagaDefinition,
    saga_input: Any,
    execution_id: str | None,
    timeout: float | timedelta | None,
    labels: Mapping[str, str] | None = None,
) -> str:
    """``engine.start``: check, record the run and send its first message; returns its id."""
    saga = definition.name
    seconds = run_timeout(f"starting saga {saga!r}", timeout)
    given_labels = checked_labels(labels)
    refuse_before_start(parts.catalog, definition, execution_id)
    if saga_input is not None and not isinstance(saga_input, Mapping):
        raise SagaError(
            f"the input of saga {saga!r} must be a mapping (dict) of named values, "
            f"got {type(saga_input).__name__}"
        )
    new_id = execution_id or new_execution_id()
    given = {} if saga_input is None else saga_input
    parts.store.ensure_schema()
    # Once per version and process: the run's version can be judged without its code.
    parts.store.run(f"storing the shape of saga {saga!r}", lambda: parts.shapes.store([definition]))
    # The run's root span: around its start, its context stored with it (tracing/spans.py).
    with parts.tracer.run(saga, definition.hash, new_id) as trace:
        try:
            state = parts.store.run(
                f"starting saga {saga!r}",
                lambda: parts.executor.create(
                    definition,
                    given,
                    new_id,
                    timeout=seconds,
                    labels=given_labels,
                    trace_context=trace,
                ),
            )
        except IntegrityError:
            _adopt(parts, definition, given, new_id)
            return new_id
        if state is ExecutionState.QUEUED:
            parts.tracer.queued()
            return new_id  # a run of its key that ends starts it (guarantee 37)
        _launch(parts, definition, new_id, announce=True)
    return new_id


def _launch(
    parts: WorkerParts, definition: SagaDefinition, execution_id: str, announce: bool
) -> None:
    # A first node that is a branch reads and journals its choice here: store work too.
    parts.store.run(
        f"sending the first message of {execution_id!r}",
        lambda: parts.executor.launch(definition, execution_id, announce=announce),
    )


def _adopt(
    parts: WorkerParts, definition: SagaDefinition, saga_input: Any, execution_id: str
) -> None:
    """``start`` with an id that is taken: the same saga and input is the same run
    (a caller retrying, or our own INSERT whose reply was lost), anything else an error.
    A run that has not moved yet gets its first message again; admission drops the
    spare if the first one was sent (guarantee 28)."""
    record, steps = parts.store.run(
        "reading an existing execution",
        lambda: queries.load_snapshot(parts.db, execution_id),
    )
    if (
        record is None
        or record.id != execution_id  # MySQL finds 'a1' for 'A1'
        or record.saga_name != definition.name
        or record.input != unpack(pack(saga_input, limit=parts.settings.max_payload_bytes))
    ):
        raise SagaError(
            f"an execution with id {execution_id!r} already exists with a different saga "
            "or input; start it with another id"
        )
    if record.state is ExecutionState.RUNNING and not steps:
        _launch(parts, definition, execution_id, announce=False)


# -- cancel -----------------------------------------------------------------------------
def cancel_run(
    parts: WorkerParts, execution_id: str, reason: str | None, actor: str | None = None
) -> CancelVerdict:
    """``engine.cancel``; the runtime hands it on when this process lacks the run's version."""
    check_lookup_id(execution_id)
    check_actor(actor)
    check_reason(reason, "a cancel reason")
    parts.store.ensure_schema()

    def cancel() -> CancelVerdict:
        record = queries.load_execution(parts.db, execution_id)
        if record is None or record.id != execution_id:
            raise ExecutionNotFoundError(f"no saga execution with id {execution_id!r}")
        definition = parts.catalog.known(record.saga_name, record.definition_hash)
        with parts.tracer.action("cancel", execution_id, actor, record.trace_context):
            verdict = parts.executor.cancel(record, reason, actor)  # hands on if missing
        if verdict is CancelVerdict.ENDED:  # it may have ended just now: say how
            record = queries.load_execution(parts.db, execution_id) or record
        _refuse(verdict, record, definition)
        return verdict

    return parts.store.run(f"cancelling {execution_id!r}", cancel)


def _cancel_handed_on(parts: WorkerParts, execution_id: str, arguments: dict[str, Any]) -> None:
    record = queries.load_execution(parts.db, execution_id)
    if record is not None:
        parts.executor.continue_cancel(record)


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


# -- signal -----------------------------------------------------------------------------
def signal_run(
    parts: WorkerParts, execution_id: str, event: str, payload: Any, actor: str | None = None
) -> bool:
    """``engine.signal``: record it here, or hand it on (returning False) when this
    process lacks the run's version."""
    if not isinstance(event, str) or not event:
        raise SagaError(f"a signal needs an event name, got {event!r}")
    check_actor(actor)
    try:
        definition, record = run_of(parts, execution_id)
    except VersionNotDeployedError as missing:
        blob = pack(
            payload,
            what=f"payload of signal {event!r} for execution {execution_id!r}",
            limit=parts.settings.max_payload_bytes,
        )
        encoded = base64.b64encode(blob).decode("ascii")
        parts.publisher.hand_on(
            missing, execution_id, "signal", event=event, payload=encoded, actor=actor
        )
        return False
    with parts.tracer.action("signal", execution_id, actor, record.trace_context):
        resumed = parts.store.run(
            f"signalling {event!r} to {execution_id!r}",
            lambda: parts.executor.signalled(
                parts.executor.waits.signal(definition, execution_id, event, payload, actor)
            ),
        )
    if resumed and record.state is ExecutionState.WAITING:  # parked at its gate since
        run = (definition.name, definition.hash, execution_id)
        parts.tracer.waited(*run, event, record.updated_at, record.trace_context, "signal")
    return resumed


def _signal_handed_on(parts: WorkerParts, execution_id: str, arguments: dict[str, Any]) -> None:
    payload = unpack(base64.b64decode(arguments["payload"]))
    actor = arguments.get("actor")  # absent from a message of an older release
    signal_run(parts, execution_id, arguments["event"], payload, actor)


# -- resume and abandon -----------------------------------------------------------------
def resume_run(parts: WorkerParts, execution_id: str, actor: str | None = None) -> None:
    """``engine.resume_compensation``: here, or handed on when this process lacks the
    run's version (only a run whose unwind is parked is resumed, checked here first)."""
    check_actor(actor)
    try:
        definition, record = run_of(parts, execution_id)
    except VersionNotDeployedError as missing:
        parts.store.run(
            f"reading the unwind of {execution_id!r}",
            lambda: require_stuck(parts.db, execution_id, "resume_compensation"),
        )
        parts.publisher.hand_on(missing, execution_id, "resume", actor=actor)
        return
    with parts.tracer.action("resume_compensation", execution_id, actor, record.trace_context):
        parts.store.run(
            f"resuming the unwind of {execution_id!r}",
            lambda: parts.executor.unwinder.resume(definition, execution_id, actor),
        )


def _resume_handed_on(parts: WorkerParts, execution_id: str, arguments: dict[str, Any]) -> None:
    resume_run(parts, execution_id, arguments.get("actor"))


def resolve_run(
    parts: WorkerParts, execution_id: str, step: str, note: str, actor: str | None = None
) -> None:
    """``engine.resolve``: here, or handed on when this process lacks the run's version
    (after the refusals it can make here: the run parked at the reversal of ``step``)."""
    check_actor(actor)
    if not isinstance(step, str) or not step:
        raise SagaError(f"resolve needs the name of the parked step, got {step!r}")
    if not isinstance(note, str) or not note.strip():
        raise SagaError("resolve needs a note: what was done by hand (it is kept in the history)")
    check_reason(note, "a resolve note")
    try:
        definition, record = run_of(parts, execution_id)
    except VersionNotDeployedError as missing:
        parts.store.run(
            f"reading the unwind of {execution_id!r}",
            lambda: require_resolvable(parts.db, execution_id, step),
        )
        parts.publisher.hand_on(missing, execution_id, "resolve", step=step, note=note, actor=actor)
        return
    with parts.tracer.action("resolve", execution_id, actor, record.trace_context):
        parts.store.run(
            f"resolving the reversal of {step!r} in {execution_id!r}",
            lambda: parts.executor.unwinder.resolve(definition, execution_id, (step, note), actor),
        )


def _resolve_handed_on(parts: WorkerParts, execution_id: str, arguments: dict[str, Any]) -> None:
    resolve_run(parts, execution_id, arguments["step"], arguments["note"], arguments.get("actor"))


def abandon_run(
    parts: WorkerParts, execution_id: str, actor: str | None, reason: str | None
) -> int:
    """``engine.abandon_compensation``: only where the run's version is registered."""
    check_actor(actor)
    check_reason(reason, "an abandon reason")
    definition, record = run_of(parts, execution_id)
    with parts.tracer.action("abandon_compensation", execution_id, actor, record.trace_context):
        return parts.store.run(
            f"abandoning the unwind of {execution_id!r}",
            lambda: parts.executor.unwinder.abandon(definition, execution_id, actor, reason),
        )


# -- handed on --------------------------------------------------------------------------
#: A worker's side of each command a process without the run's version hands on.
HANDED_ON: dict[str, Callable[[WorkerParts, str, dict[str, Any]], None]] = {
    "signal": _signal_handed_on,
    "resume": _resume_handed_on,
    "resolve": _resolve_handed_on,
    "cancel": _cancel_handed_on,
    **held_moves.HANDED_ON,
    **pause_moves.HANDED_ON,
}


def carry_out(
    parts: WorkerParts, execution_id: str, command: str, arguments: dict[str, Any]
) -> NoBody:
    """A worker's side of a handed-on call (the message's version is registered here:
    ``COMMAND_TASK`` checked it). What the run refuses now is logged: its caller is gone."""
    try:
        arguments = open_arguments(execution_id, command, arguments)
    except UnsealedCommand as untrusted:  # nothing read or stored for it
        logger.warning(
            "execution %s: a handed-on %s was refused and nothing done: %s",
            execution_id,
            command,
            untrusted,
        )
        return NoBody(f"{command} refused: {untrusted}")
    try:
        handed_on = HANDED_ON.get(command)
        if handed_on is None:
            raise SagaError(f"unknown command {command!r} (sent by a newer release?)")
        handed_on(parts, execution_id, arguments)
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
