"""Signals, sub-saga links, the wait deadline index, and archive tables.

Revision ID: 0002
Revises: 0001
"""

from typing import Any

import sqlalchemy as sa
from alembic import op

from celery_saga.store.migrations.shared import Blob, RecordId, Timestamp, first_columns, run_id

revision = "0002"
down_revision = "0001"


def _execution_columns() -> list[sa.Column[Any]]:
    return [
        sa.Column("id", sa.String(64), nullable=False),
        *first_columns("saga_executions"),
    ]


def _step_columns() -> list[sa.Column[Any]]:
    return [
        sa.Column("id", RecordId, nullable=False, autoincrement=False),
        sa.Column("execution_id", sa.String(64), nullable=False),
        *first_columns("saga_steps"),
        sa.Column("child_execution_id", sa.String(64)),
    ]


def _signal_columns() -> list[sa.Column[Any]]:
    return [
        sa.Column("event", sa.String(200), nullable=False),
        sa.Column("payload", Blob),
        sa.Column("received_at", Timestamp, nullable=False),
    ]


def upgrade() -> None:
    with op.batch_alter_table("saga_steps") as batch:
        batch.add_column(sa.Column("child_execution_id", sa.String(64)))
    op.create_index("ix_saga_executions_wake", "saga_executions", ["state", "wake_at"])
    op.create_table(
        "saga_signals",
        run_id(nullable=False),
        *_signal_columns(),
        sa.PrimaryKeyConstraint("execution_id", "event", name="pk_saga_signals"),
    )
    op.create_table(
        "saga_executions_archive",
        *_execution_columns(),
        sa.Column("archived_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_saga_executions_archive"),
    )
    op.create_table(
        "saga_steps_archive",
        *_step_columns(),
        sa.PrimaryKeyConstraint("execution_id", "name", name="pk_saga_steps_archive"),
    )
    op.create_table(
        "saga_signals_archive",
        sa.Column("execution_id", sa.String(64), nullable=False),
        *_signal_columns(),
        sa.PrimaryKeyConstraint("execution_id", "event", name="pk_saga_signals_archive"),
    )
    op.create_table(
        "saga_decisions_archive",
        sa.Column("execution_id", sa.String(64), nullable=False),
        *first_columns("saga_decisions"),
        sa.PrimaryKeyConstraint("execution_id", "key", name="pk_saga_decisions_archive"),
    )


def downgrade() -> None:
    for table in (
        "saga_decisions_archive",
        "saga_signals_archive",
        "saga_steps_archive",
        "saga_executions_archive",
        "saga_signals",
    ):
        op.drop_table(table)
    op.drop_index("ix_saga_executions_wake", "saga_executions")
    with op.batch_alter_table("saga_steps") as batch:
        batch.drop_column("child_execution_id")
