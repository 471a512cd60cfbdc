"""The runs a release would strand (``saga versions check``), and the shape of a run's
version wherever it comes from (guarantee 22).

Run from the code about to ship, against the store: every run that is not over (moving,
waiting, unwinding, parked, cancelling, or failed with its unwind owed) whose version this
code does not register would be left to workers that no longer exist. For each, the check
says whether ``upgrade`` can move it to a version this code has, judged with its version's
shape as the store keeps it (``saga_version_shapes``), so the old code is not needed: a
run whose reached nodes (and so its completed steps' compensations) are not in this code
cannot be moved.
"""

from __future__ import annotations

from dataclasses import dataclass

from celery_saga.decisions.versions import Stranding, judge_stranded
from celery_saga.definition.shapes import VersionShape, read_shape, shape_of
from celery_saga.errors import SagaError, UpgradeRefusedError
from celery_saga.store import version_shapes, versions
from celery_saga.worker.parts import WorkerParts


@dataclass(frozen=True)
class StrandedRun:
    """A run this code lacks the version of, where it stands (``node``: the node it has
    reached, when its shape is known), and what ``upgrade`` can do for it: move it to
    ``to``, or not (``stranding``, ``reason``, ``differs``: the first node that differs)."""

    execution_id: str
    saga: str
    version: str
    label: str | None
    state: str
    node: str | None
    stranding: Stranding
    to: str | None
    differs: str | None
    reason: str


@dataclass(frozen=True)
class VersionCheck:
    """What a release would strand: nothing when ``stranded`` is empty."""

    stranded: tuple[StrandedRun, ...]

    @property
    def ok(self) -> bool:
        return not self.stranded


def check_versions(parts: WorkerParts) -> VersionCheck:
    """The runs the versions registered in this process would strand. Reads the unfinished
    runs of other versions (one query, by index) and the shapes of their versions."""
    catalog = parts.catalog
    here = {name: [shape_of(d) for d in catalog.versions(name)] for name in catalog.names()}
    hashes = {s.hash for shapes in here.values() for s in shapes}
    runs = versions.unfinished_runs_outside(parts.db, hashes)
    stored = _stored_shapes(parts, {(r.saga_name, r.definition_hash) for r in runs})
    stranded = []
    for run in runs:
        shape = stored.get((run.saga_name, run.definition_hash))
        releases = [(s.hash, s.nodes) for s in here.get(run.saga_name, [])]
        verdict = judge_stranded(run.cursor, None if shape is None else shape.nodes, releases)
        node = None
        if shape is not None and run.cursor < len(shape.nodes):
            node = shape.nodes[run.cursor][0]
        stranded.append(
            StrandedRun(
                run.execution_id,
                run.saga_name,
                run.definition_hash,
                None if shape is None else shape.label,
                run.state,
                node,
                verdict.kind,
                verdict.to,
                verdict.node,
                verdict.reason,
            )
        )
    return VersionCheck(tuple(stranded))


def _stored_shapes(
    parts: WorkerParts, wanted: set[tuple[str, str]]
) -> dict[tuple[str, str], VersionShape]:
    """The stored shapes of ``wanted``; one that does not hash to its version counts as
    not stored (the check then says it cannot judge the run)."""
    found = {}
    for (saga, definition_hash), text in version_shapes.load_shapes(parts.db, wanted).items():
        try:
            found[(saga, definition_hash)] = read_shape(saga, definition_hash, text)
        except SagaError:
            continue
    return found


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
