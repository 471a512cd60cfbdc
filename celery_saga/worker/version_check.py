"""The shape of a run's version wherever it comes from: its code when this process has it,
else the store (``saga_version_shapes``), so a run is judged against another version
without its own version's code (guarantee 22)."""

from __future__ import annotations

from celery_saga.definition.shapes import VersionShape, read_shape, shape_of
from celery_saga.errors import SagaError, UpgradeRefusedError
from celery_saga.store import version_shapes
from celery_saga.worker.parts import WorkerParts


def run_shape(
    parts: WorkerParts, saga: str, definition_hash: str, execution_id: str
) -> VersionShape:
    """The shape of run ``execution_id``'s version: from its code when this process has it,
    else as the store keeps it. ``UpgradeRefusedError`` when neither has it."""
    definition = parts.catalog(saga, definition_hash)
    if definition is not None:
        return shape_of(definition)
    text = version_shapes.load_shapes(parts.db, [(saga, definition_hash)]).get(
        (saga, definition_hash)
    )
    if text is None:
        raise UpgradeRefusedError(
            f"execution {execution_id!r} runs version {definition_hash} of saga {saga!r}, "
            "which is not registered in this process and whose shape is not in the store "
            "(no process with that version has started since the store was upgraded): "
            "upgrade it from a process that has that version; nothing was changed"
        )
    try:
        return read_shape(saga, definition_hash, text)
    except SagaError as error:
        raise UpgradeRefusedError(
            f"execution {execution_id!r} cannot be judged: {error}; nothing was changed"
        ) from None
