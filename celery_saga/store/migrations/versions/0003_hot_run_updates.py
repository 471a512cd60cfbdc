"""Run-row updates that PostgreSQL can make HOT: no index holds ``updated_at``.

Every step rewrites ``updated_at`` (and ``version``, ``cursor``); while one of them sat in an
index, each step wrote a new entry into every index of the run row. The sweeps now find
their runs through ``state`` (live runs are few) and ``created_at`` (which never changes),
and PostgreSQL keeps free room in each page so that the new row version fits beside the old.

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"

#: Room left in each page for HOT updates of the run rows (PostgreSQL only).
FILLFACTOR = 70


def upgrade() -> None:
    op.create_index(
        "ix_saga_executions_state_created", "saga_executions", ["state", "created_at", "id"]
    )
    op.drop_index("ix_saga_executions_state", "saga_executions")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE saga_executions SET (fillfactor = {FILLFACTOR})")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE saga_executions RESET (fillfactor)")
    op.create_index("ix_saga_executions_state", "saga_executions", ["state", "updated_at"])
    op.drop_index("ix_saga_executions_state_created", "saga_executions")
