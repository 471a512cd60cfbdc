"""Public calls that act on a stored run by its id: ``engine.cancel`` (guarantee 31), and
``start`` meeting an id that is taken (guarantee 28)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery_saga.decisions.cancel import CancelVerdict
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import PivotNode
from celery_saga.errors import ExecutionNotFoundError, InvalidStateError, SagaError
from celery_saga.limits import check_lookup_id
from celery_saga.records import ExecutionRecord, ExecutionState
from celery_saga.store import queries
from celery_saga.store.codec import pack, unpack

if TYPE_CHECKING:
    from celery_saga.worker.engine import SagaEngine

#: What a cancel that changed nothing says.
NO_OP = {
    CancelVerdict.ALREADY_CANCELLED: "is already cancelled; nothing changed",
    CancelVerdict.UNWINDING: (
        "is unwinding already; its compensations are never interrupted, nothing changed"
    ),
}


def cancel_run(engine: SagaEngine, execution_id: str, reason: str | None) -> CancelVerdict:
    """Cancel a run (see ``SagaEngine.cancel``)."""
    check_lookup_id(execution_id)
    if reason is not None and not isinstance(reason, str):
        raise SagaError(f"a cancel reason is text, got {type(reason).__name__}")
    engine.ensure_schema()

    def cancel() -> CancelVerdict:
        record = queries.load_execution(engine.db, execution_id)
        if record is None or record.id != execution_id:
            raise ExecutionNotFoundError(f"no saga execution with id {execution_id!r}")
        definition = engine.catalog.for_run(record.saga_name, record.definition_hash, record.id)
        verdict = engine.executor.cancellation.cancel(record, reason)
        if verdict is CancelVerdict.ENDED:  # it may have ended just now: say how
            record = queries.load_execution(engine.db, execution_id) or record
        _refuse(verdict, record, definition)
        return verdict

    return engine._store(f"cancelling {execution_id!r}", cancel)


def _refuse(verdict: CancelVerdict, record: ExecutionRecord, definition: SagaDefinition) -> None:
    what = f"execution {record.id!r} of saga {record.saga_name!r}"
    if verdict is CancelVerdict.PAST_PIVOT:
        raise InvalidStateError(
            f"{what} has passed its pivot ({pivot_name(definition)}), the point of no "
            "return: it cannot be cancelled"
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
