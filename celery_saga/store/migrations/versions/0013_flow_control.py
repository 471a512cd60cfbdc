"""Flow control by key: the key a run was admitted or queued under, and each key's slots.

``flow_key`` is NULL for a saga without a limit; ``saga_flow_slots`` counts, per saga and
key, the runs that hold a slot and the limit the last admission applied.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

from celery_saga.store.migrations.shared import RUN_TABLES, add_columns, drop_columns

revision = "0013"
down_revision = "0012"

FLOW_INDEX = ("saga_name", "flow_key", "state", "created_at", "id")


def upgrade() -> None:
    add_columns(RUN_TABLES, {"flow_key": sa.String(200)})
    op.create_index("ix_saga_executions_flow", "saga_executions", list(FLOW_INDEX))
    op.create_table(
        "saga_flow_slots",
        sa.Column("saga_name", sa.String(200), nullable=False),
        sa.Column("flow_key", sa.String(200), nullable=False),
        sa.Column("live", sa.Integer, nullable=False),
        sa.Column("run_limit", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("saga_name", "flow_key", name="pk_saga_flow_slots"),
    )


def downgrade() -> None:
    op.drop_table("saga_flow_slots")
    op.drop_index("ix_saga_executions_flow", "saga_executions")
    drop_columns(RUN_TABLES, ("flow_key",))
