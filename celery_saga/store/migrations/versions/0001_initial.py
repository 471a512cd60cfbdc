"""Initial schema: executions, step records, control-flow decisions.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

from celery_saga.store.migrations.shared import Blob, RecordId, Timestamp, run_id

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "saga_executions",
        sa.Column("id", sa.String(64), primary_key=True),
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
    )
    op.create_index("ix_saga_executions_listing", "saga_executions", ["created_at", "id"])
    op.create_index("ix_saga_executions_state", "saga_executions", ["state", "updated_at"])
    op.create_index("ix_saga_executions_saga_name", "saga_executions", ["saga_name", "created_at"])
    op.create_index("ix_saga_executions_parent", "saga_executions", ["parent_execution_id"])
    op.create_table(
        "saga_steps",
        sa.Column("id", RecordId, primary_key=True, autoincrement=True),
        run_id(nullable=False),
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
        sa.UniqueConstraint("execution_id", "name", name="uq_saga_steps_execution_name"),
    )
    op.create_table(
        "saga_decisions",
        run_id(nullable=False),
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("value", Blob),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("execution_id", "key", name="pk_saga_decisions"),
    )


def downgrade() -> None:
    op.drop_table("saga_decisions")
    op.drop_table("saga_steps")
    op.drop_table("saga_executions")
