"""Initial schema: executions, step records, control-flow decisions.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

from celery_saga.store.migrations.shared import RecordId, Timestamp, first_columns, run_id

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "saga_executions",
        sa.Column("id", sa.String(64), primary_key=True),
        *first_columns("saga_executions"),
    )
    op.create_index("ix_saga_executions_listing", "saga_executions", ["created_at", "id"])
    op.create_index("ix_saga_executions_state", "saga_executions", ["state", "updated_at"])
    op.create_index("ix_saga_executions_saga_name", "saga_executions", ["saga_name", "created_at"])
    op.create_index("ix_saga_executions_parent", "saga_executions", ["parent_execution_id"])
    op.create_table(
        "saga_steps",
        sa.Column("id", RecordId, primary_key=True, autoincrement=True),
        run_id(nullable=False),
        *first_columns("saga_steps"),
        sa.UniqueConstraint("execution_id", "name", name="uq_saga_steps_execution_name"),
    )
    op.create_table(
        "saga_decisions",
        run_id(nullable=False),
        *first_columns("saga_decisions"),
        sa.PrimaryKeyConstraint("execution_id", "key", name="pk_saga_decisions"),
    )


def downgrade() -> None:
    op.drop_table("saga_decisions")
    op.drop_table("saga_steps")
    op.drop_table("saga_executions")
