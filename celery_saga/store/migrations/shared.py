"""What the revisions share: their column types, adding or dropping columns on a few
tables at once, and the first tables' columns (0002 archives them). A revision's effect
never changes once released, so neither does anything here: a column that needs another
type gets a new name."""

from collections.abc import Iterable, Mapping
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

Blob = sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
#: Microseconds on MySQL/MariaDB too.
Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
RecordId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def run_id(**options: Any) -> sa.Column:  # type: ignore[type-arg]
    """The ``execution_id`` column of a run's child table, whose rows go with the run."""
    return sa.Column(
        "execution_id",
        sa.String(64),
        sa.ForeignKey("saga_executions.id", ondelete="CASCADE"),
        **options,
    )


#: Where a run's row is: live, and archived.
RUN_TABLES = ("saga_executions", "saga_executions_archive")


def add_columns(tables: Iterable[str], columns: Mapping[str, Any]) -> None:
    """Add the nullable ``columns`` (name: type) to each of ``tables``, in that order."""
    for table in tables:
        with op.batch_alter_table(table) as batch:
            for name, kind in columns.items():
                batch.add_column(sa.Column(name, kind))


def drop_columns(tables: Iterable[str], names: Iterable[str]) -> None:
    """Drop the columns ``names`` from each of ``tables``, in that order."""
    for table in tables:
        with op.batch_alter_table(table) as batch:
            for name in names:
                batch.drop_column(name)


def first_columns(table: str) -> list[sa.Column]:  # type: ignore[type-arg]
    """The columns of ``table`` (``saga_executions``, ``saga_steps`` or ``saga_decisions``)
    after its key columns, as the first revision made them: 0002's archive copies of those
    tables have the same, fresh ``Column`` objects each call."""
    return _FIRST[table]()


def version_columns() -> list[sa.Column]:  # type: ignore[type-arg]
    """What names a version of a saga (its name, its definition's hash, its label) in the
    tables about versions (0005's ``saga_versions``, 0010's ``saga_version_shapes``)."""
    return [
        sa.Column("saga_name", sa.String(200), nullable=False),
        sa.Column("definition_hash", sa.String(64), nullable=False),
        sa.Column("label", sa.String(200)),
    ]


def _first_run_columns() -> list[sa.Column]:  # type: ignore[type-arg]
    return [
        sa.Column("saga_name", sa.String(200), nullable=False),
        sa.Column("definition_hash", sa.String(64), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("cursor", sa.Integer, nullable=False),
        sa.Column("cursor_sub", sa.Integer, nullable=False),
        sa.Column("input", Blob, nullable=False),
        sa.Column("failure_reason", sa.Text),
        sa.Column("rollback_status", sa.String(32)),
        sa.Column("rollback_reason", sa.Text),
        sa.Column("committed_at", Timestamp),
        sa.Column("parent_execution_id", sa.String(64)),
        sa.Column("lease_expires_at", Timestamp),
        sa.Column("wake_at", Timestamp),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
    ]


def _first_step_columns() -> list[sa.Column]:  # type: ignore[type-arg]
    return [
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("node", sa.Integer, nullable=False),
        sa.Column("sub", sa.Integer, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("idempotency_key", sa.String(400), nullable=False),
        sa.Column("compensatable", sa.Boolean, nullable=False),
        sa.Column("result", Blob),
        sa.Column("error", sa.Text),
        sa.Column("lease_expires_at", Timestamp),
        sa.Column("started_at", Timestamp, nullable=False),
        sa.Column("completed_at", Timestamp),
        sa.Column("compensation_status", sa.String(32)),
        sa.Column("compensation_reason", sa.Text),
        sa.Column("compensated_at", Timestamp),
        sa.Column("compensation_attempts", sa.Integer, nullable=False),
        sa.Column("compensation_lease_expires_at", Timestamp),
    ]


def _first_decision_columns() -> list[sa.Column]:  # type: ignore[type-arg]
    return [
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("value", Blob),
        sa.Column("created_at", Timestamp, nullable=False),
    ]


_FIRST = {
    "saga_executions": _first_run_columns,
    "saga_steps": _first_step_columns,
    "saga_decisions": _first_decision_columns,
}
