"""A run's labels: written once with the run (one INSERT in the start's transaction, none
for a run without labels), read for the views, archived and deleted with it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sqlalchemy import Connection, insert, select

from celery_saga.store.database import Database
from celery_saga.store.tables import run_labels, run_labels_archive


def write(connection: Connection, execution_id: str, labels: Mapping[str, str]) -> None:
    """Store ``labels`` (already checked) in the caller's transaction: one statement."""
    rows = [{"execution_id": execution_id, "key": k, "value": v} for k, v in labels.items()]
    connection.execute(insert(run_labels), rows)


def load(
    db: Database, execution_ids: Iterable[str], archived: bool = False
) -> dict[str, dict[str, str]]:
    """The labels of each of ``execution_ids`` that has any (key order: by key)."""
    ids = list(execution_ids)
    if not ids:
        return {}
    table = run_labels_archive if archived else run_labels
    query = (
        select(table.c.execution_id, table.c.key, table.c.value)
        .where(table.c.execution_id.in_(ids))
        .order_by(table.c.execution_id, table.c.key)
    )
    found: dict[str, dict[str, str]] = {}
    for row in db.read(query):
        found.setdefault(row["execution_id"], {})[row["key"]] = row["value"]
    return found
