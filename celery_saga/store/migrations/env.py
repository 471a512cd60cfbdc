"""Alembic environment of the saga store: runs on the connection the store hands it."""

from __future__ import annotations

from alembic import context

from celery_saga.store.tables import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table=context.config.get_main_option("version_table"),
)
with context.begin_transaction():
    context.run_migrations()
