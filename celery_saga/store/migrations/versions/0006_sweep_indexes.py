"""Indexes that let the sweeps and operator reads seek what is due instead of reading history.

``ix_saga_executions_unwind_owed`` holds the failed runs whose unwind never started, which the
recovery sweep reads every few seconds; without it every sweep read every failed run ever
stored. On PostgreSQL and SQLite it is partial (those runs alone); MySQL has no partial
index and gets (state, rollback_status). ``ix_saga_executions_rollback`` answers ``list`` by
rollback status in listing order, and the index on saga_name gains ``id`` for that order.
None holds a column that every step changes (see 0003): per-step updates stay HOT.
On PostgreSQL, statistics on (state, rollback_status) together: judged apart, a NULL rollback
status (every completed run has one) made the planner expect a sixth of the history among
the owed unwinds, and plan the sweep as a parallel sort.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"

LISTING = ["created_at", "id"]
UNWIND_OWED = "state = 'failed' AND rollback_status IS NULL"
STATISTICS = "st_saga_executions_state_rollback"


def upgrade() -> None:
    op.create_index(
        "ix_saga_executions_unwind_owed",
        "saga_executions",
        ["state", "rollback_status"],
        postgresql_where=sa.text(UNWIND_OWED),
        sqlite_where=sa.text(UNWIND_OWED),
    )
    op.create_index(
        "ix_saga_executions_rollback", "saga_executions", ["rollback_status", *LISTING]
    )
    op.create_index("ix_saga_executions_saga", "saga_executions", ["saga_name", *LISTING])
    op.drop_index("ix_saga_executions_saga_name", "saga_executions")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            f"CREATE STATISTICS {STATISTICS} (mcv) ON state, rollback_status FROM saga_executions"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP STATISTICS {STATISTICS}")
    op.create_index("ix_saga_executions_saga_name", "saga_executions", ["saga_name", "created_at"])
    op.drop_index("ix_saga_executions_saga", "saga_executions")
    op.drop_index("ix_saga_executions_rollback", "saga_executions")
    op.drop_index("ix_saga_executions_unwind_owed", "saga_executions")
