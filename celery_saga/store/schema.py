"""Operator access to the store's migrations: which revision it is at, and moving it.

``Database.migrate`` upgrades to the newest revision on first use; these functions serve the
``celery saga db`` commands, which also show the revision and step back to an older one.
"""

from __future__ import annotations

import logging
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection

from celery_saga.errors import SagaError
from celery_saga.store.database import _MIGRATIONS, VERSION_TABLE, Database

logger = logging.getLogger("celery_saga")


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    config.set_main_option("version_table", VERSION_TABLE)
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def revision_on(connection: Connection) -> str | None:
    """The revision stored in the saga version table (None for a store never migrated)."""
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def current_revision(db: Database) -> str | None:
    with db.engine.connect() as connection:
        return revision_on(connection)


def _known(revision: str) -> str:
    if revision in ("head", "base"):
        return revision
    script = ScriptDirectory.from_config(alembic_config())
    known = [r.revision for r in script.walk_revisions()]
    if revision not in known:
        raise SagaError(
            f"unknown store revision {revision!r}; shipped: {', '.join(sorted(known))}, head, base"
        )
    return revision


def move(db: Database, revision: str, *, down: bool) -> tuple[str | None, str | None]:
    """Upgrade (or downgrade) the store to ``revision``; returns (before, after).

    Runs in one transaction under the same lock as ``Database.migrate``, so it cannot
    interleave with a worker migrating on start-up.
    """
    target = _known(revision)
    config = alembic_config()
    with _quiet_alembic(), db.engine.begin() as connection, db.migration_lock(connection):
        before = revision_on(connection)
        config.attributes["connection"] = connection
        if down:
            command.downgrade(config, target)
        else:
            command.upgrade(config, target)
        after = revision_on(connection)
    log_change(before, after)
    return before, after


def log_change(before: str | None, after: str | None) -> None:
    """One INFO line when the schema actually moved; nothing when it was already current."""
    if before != after:
        logger.info("saga store schema migrated from %s to %s", before or "empty", after)


class _quiet_alembic:
    """Alembic announces its context at INFO on every call; only real changes are news."""

    def __enter__(self) -> None:
        self._logger = logging.getLogger("alembic")
        self._level = self._logger.level
        self._logger.setLevel(max(self._level, logging.WARNING))

    def __exit__(self, *_: Any) -> None:
        self._logger.setLevel(self._level)
