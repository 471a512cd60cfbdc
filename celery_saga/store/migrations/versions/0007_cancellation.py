"""Cancellation and deadlines: when a run was cancelled, and when it must be.

``cancelled_at`` marks a run whose cancel was stored (its unwind then ends in ``cancelled``,
not ``failed``); ``deadline_at`` is when a live run is cancelled by the timer sweep. It is
set at start and cleared when the run ends, so its index holds only live runs.

Revision ID: 0007
Revises: 0006
"""

from alembic import op

from celery_saga.store.migrations.shared import RUN_TABLES, Timestamp, add_columns, drop_columns

revision = "0007"
down_revision = "0006"

COLUMNS = ("cancelled_at", "deadline_at")


def upgrade() -> None:
    add_columns(RUN_TABLES, dict.fromkeys(COLUMNS, Timestamp))
    op.create_index("ix_saga_executions_deadline", "saga_executions", ["deadline_at"])


def downgrade() -> None:
    op.drop_index("ix_saga_executions_deadline", "saga_executions")
    drop_columns(RUN_TABLES, COLUMNS)
