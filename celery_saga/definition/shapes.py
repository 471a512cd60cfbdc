"""A version's shape as data: what its structural hash covers, kept in the store beside the
version (``saga_version_shapes``), so that a process without the version's code can still
judge its runs: ``upgrade`` and ``saga versions check`` compare the nodes a run has reached
with those of another version (guarantee 22).

The stored text is the very JSON the hash is taken of (``hashing.shape_text``): a shape
read back is trusted only when it hashes to its version again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.hashing import hash_of_text, shape_text
from celery_saga.errors import SagaError


@dataclass(frozen=True)
class VersionShape:
    """One version: its saga, hash, label and ``nodes`` as (name, shape) pairs in order,
    the name as an operator knows the node (``worker/versioning.node_name``). ``text`` is
    what the store keeps."""

    saga: str
    hash: str
    label: str | None
    nodes: tuple[tuple[str, Any], ...]
    text: str


def shape_of(definition: SagaDefinition) -> VersionShape:
    """A registered version's shape, as it reads back from the store."""
    text = shape_text(definition.name, definition.nodes, definition.label)
    return read_shape(definition.name, definition.hash, text)


def read_shape(saga: str, definition_hash: str, text: str) -> VersionShape:
    """The shape stored for version ``definition_hash`` of ``saga``; a text that is not that
    version's (it does not hash to it) is refused, so no run is judged by a wrong graph."""
    if hash_of_text(text) != definition_hash:
        raise SagaError(
            f"the shape stored for version {definition_hash} of saga {saga!r} does not hash "
            "to that version; it is not used"
        )
    document = json.loads(text)
    name, nodes = document[0], document[1]
    if name != saga:
        raise SagaError(
            f"the shape stored for version {definition_hash} of saga {saga!r} is saga "
            f"{name!r}'s; it is not used"
        )
    label = document[2][1] if len(document) > 2 else None
    pairs = tuple((node_name_of(shape), shape) for shape in nodes)
    return VersionShape(saga, definition_hash, label, pairs, text)


def node_name_of(shape: list[Any]) -> str:
    """A node's name from its shape (``hashing.node_shape``): its step's name,
    ``wait_for('event')``, a group's or loop's own name, ``pivot``."""
    kind = shape[0]
    if kind == "step":
        return str(shape[1][0])
    if kind == "wait":
        return f"wait_for({shape[1]!r})"
    if kind == "pivot":
        return "pivot"
    return str(shape[1] or "pivot")
