"""Looking up a stored run's own version, and naming its pivot, for the operator's
commands (``run_commands``, ``held_moves``)."""

from __future__ import annotations

from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import PivotNode, WaitNode, node_name
from celery_saga.errors import ExecutionNotFoundError
from celery_saga.limits import check_lookup_id
from celery_saga.records import ExecutionRecord
from celery_saga.store import queries
from celery_saga.worker.parts import WorkerParts


def definition_of(parts: WorkerParts, execution_id: str) -> SagaDefinition:
    """The stored run's own version, never another: a process without it raises
    ``VersionNotDeployedError``, storing nothing."""
    return run_of(parts, execution_id)[0]


def run_of(parts: WorkerParts, execution_id: str) -> tuple[SagaDefinition, ExecutionRecord]:
    """The stored run, and its own version (as ``definition_of``)."""
    check_lookup_id(execution_id)
    parts.store.ensure_schema()
    record = parts.store.run(
        f"reading execution {execution_id!r}",
        lambda: queries.load_execution(parts.db, execution_id),
    )
    if record is None or record.id != execution_id:  # MySQL finds 'a1' for 'A1 '
        raise ExecutionNotFoundError(f"no saga execution with id {execution_id!r}")
    return parts.catalog.for_run(record.saga_name, record.definition_hash, record.id), record


def pivot_name(definition: SagaDefinition) -> str:
    """The pivot as an operator knows it: after which step it stands."""
    before = None
    for node in definition.nodes:
        match node:
            case PivotNode():
                return f"the pivot after step {before!r}" if before else "the pivot"
            case WaitNode():
                continue
            case _:  # every other node has a name of its own
                before = node_name(node)
    return "the pivot"
