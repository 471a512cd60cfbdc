"""Indexes that let the sweeps and operator reads seek what is due instead of reading history.

``ix_saga_executions_unwind`` (state, rollback_status, created_at, id) finds the failed runs
whose unwind never started (``state = 'failed' AND rollback_status IS NULL``) without reading
every failed run ever stored, and hands retention each kind of finished run oldest first.
``ix_saga_executions_rollback`` (rollback_status, created_at, id) answers ``list`` by rollback
status in listing order, and the index on saga_name gains ``id`` for the listing's order.
None holds a column that every step changes (see 0003): per-step updates stay HOT.

Revision ID: 0006
Revises: 0005
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


LISTING = ["created_at", "id"]


def upgrade() -> None:
    op.create_index(
        "ix_saga_executions_unwind", "saga_executions", ["state", "rollback_status", *LISTING]
    )
    op.create_index(
        "ix_saga_executions_rollback",
        "saga_executions",
        ["rollback_status", *LISTING],
    )
    op.create_index("ix_saga_executions_saga", "saga_executions", ["saga_name", *LISTING])
    op.drop_index("ix_saga_executions_saga_name", "saga_executions")


def downgrade() -> None:
    op.create_index("ix_saga_executions_saga_name", "saga_executions", ["saga_name", "created_at"])
    op.drop_index("ix_saga_executions_saga", "saga_executions")
    op.drop_index("ix_saga_executions_rollback", "saga_executions")
    op.drop_index("ix_saga_executions_unwind", "saga_executions")
