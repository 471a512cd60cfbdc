"""The deployed definitions of this process: every registered version of each saga.

A saga name may have several versions side by side (guarantee 22), keyed by (name,
definition hash). A new run starts on the newest one (the last registered); a run's own
messages are handled only with the version it started on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from celery_saga.decisions.versions import Placement, VersionRef, label_taken, newest, place
from celery_saga.definition.builder import SagaDefinition
from celery_saga.errors import DefinitionError, VersionNotDeployedError


class Catalog:
    """The deployed definitions by (name, hash); calling it looks one up.

    ``discover`` (the engine's autodiscovery) runs on a miss, before the name is called
    unknown: a process that never imported the defining module finds it then."""

    def __init__(self, discover: Callable[[], None] | None = None) -> None:
        self._versions: dict[str, dict[str, SagaDefinition]] = {}
        self._children: frozenset[str] = frozenset()
        self._discover = discover

    def __call__(self, name: str, definition_hash: str | None = None) -> SagaDefinition | None:
        """The newest version of ``name``, or the version ``definition_hash`` of it."""
        definition = self.known(name, definition_hash)
        if definition is None and self._discover is not None:
            self._discover()
            definition = self.known(name, definition_hash)
        return definition

    def known(self, name: str, definition_hash: str | None = None) -> SagaDefinition | None:
        """As calling it, without discovery (for ``register``: a module being imported must
        not import its siblings halfway)."""
        versions = self._versions.get(name, {})
        if definition_hash is not None:
            return versions.get(definition_hash)
        refs = newest([VersionRef(h) for h in versions])
        return None if refs is None else versions[refs.hash]

    def for_run(self, name: str, definition_hash: str, execution_id: str) -> SagaDefinition:
        """The version run ``execution_id`` started on; ``VersionNotDeployedError`` when this
        process does not have it (the run is never handled with another version)."""
        registered = self.versions(name)
        if place(definition_hash, [VersionRef(d.hash) for d in registered]) is Placement.RUN:
            return next(d for d in registered if d.hash == definition_hash)
        if self._discover is not None:
            self._discover()
            found = self.known(name, definition_hash)
            if found is not None:
                return found
        here = ", ".join(d.hash for d in self.versions(name)) or "none"
        raise VersionNotDeployedError(
            f"execution {execution_id!r} runs version {definition_hash} of saga {name!r}, "
            f"which is not registered in this process (it has: {here}); a worker that has "
            "it carries the run on (see `celery saga versions`)",
            name,
            definition_hash,
        )

    def versions(self, name: str) -> list[SagaDefinition]:
        """Every registered version of ``name``, oldest first."""
        return list(self._versions.get(name, {}).values())

    def names(self) -> list[str]:
        return sorted(self._versions)

    def check_labels(self, new: Sequence[SagaDefinition]) -> None:
        """Refuse ``new`` (about to be registered) when one of them gives its saga's
        ``version=`` label to a graph other than the one that label already names, here or
        earlier in ``new``."""
        known = {
            name: [VersionRef(d.hash, d.label) for d in self.versions(name)]
            for name in {d.name for d in new}
        }
        for definition in new:
            refs = known[definition.name]
            taken = label_taken(definition.label, definition.hash, refs)
            if taken is not None:
                raise DefinitionError(
                    f"saga {definition.name!r}: version label {definition.label!r} already "
                    f"names version {taken.hash}, a different graph from this one "
                    f"({definition.hash}): give the changed graph a label of its own; "
                    "nothing was registered"
                )
            refs.append(VersionRef(definition.hash, definition.label))

    def add(self, definition: SagaDefinition) -> None:
        versions = self._versions.setdefault(definition.name, {})
        versions.setdefault(definition.hash, definition)
        self._children = frozenset(
            child
            for known in self._versions.values()
            for version in known.values()
            for child in version.child_sagas
        )

    def may_be_child(self, name: str) -> bool:
        """Whether some deployed saga runs ``name`` as a sub-saga (so a run of it may have a
        parent to notify)."""
        return name in self._children
