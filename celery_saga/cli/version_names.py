"""Turning the versions an operator names (a hash, a hash prefix, a label) into hashes."""

from __future__ import annotations

from collections.abc import Sequence

from celery_saga.decisions.versions import VersionRef, find_version
from celery_saga.errors import SagaError
from celery_saga.worker.engine import SagaEngine


def version_hashes(engine: SagaEngine, named: Sequence[str]) -> list[str]:
    """The hash of each version in ``named``, among the versions registered here, seen on a
    worker, or with runs; a name none of them answers to is refused."""
    if not named:
        return []
    known = [VersionRef(v.hash, v.label) for v in engine.versions()]
    hashes = []
    for name in named:
        found = find_version(name, known)
        if found is None:
            raise SagaError(
                f"no version {name!r} is known (see `saga versions` for hashes and labels)"
            )
        hashes.append(found.hash)
    return hashes
