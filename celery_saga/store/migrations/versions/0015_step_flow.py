"""Step flow control: ``step(concurrency=Limit(...))`` and ``step(rate=Rate(...))``.

``saga_step_keys`` holds one row per task scope and key (the lock each admission takes, and
a rate's next free turn); ``saga_step_waits`` one row per step of a run at a limited door:
waiting for a slot, holding one, or booked for a turn.

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

from celery_saga.store.migrations.shared import Timestamp, run_id

revision = "0015"
down_revision = "0014"


def upgrade() -> None:
    op.create_table(
        "saga_step_keys",
        sa.Column("scope", sa.String(200), nullable=False),
        sa.Column("flow_key", sa.String(200), nullable=False),
        sa.Column("next_turn_at", Timestamp),
        sa.Column("last_start_at", Timestamp),
        sa.PrimaryKeyConstraint("scope", "flow_key", name="pk_saga_step_keys"),
    )
    op.create_table(
        "saga_step_waits",
        run_id(nullable=False),
        sa.Column("record", sa.String(200), nullable=False),
        sa.Column("saga_name", sa.String(200), nullable=False),
        sa.Column("definition_hash", sa.String(64), nullable=False),
        sa.Column("scope", sa.String(200), nullable=False),
        sa.Column("flow_key", sa.String(200), nullable=False),
        sa.Column("node", sa.Integer, nullable=False),
        sa.Column("sub", sa.Integer, nullable=False),
        sa.Column("member", sa.Integer, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("waiting_since", Timestamp, nullable=False),
        sa.Column("granted_at", Timestamp),
        sa.Column("turn_at", Timestamp),
        sa.PrimaryKeyConstraint("execution_id", "record", name="pk_saga_step_waits"),
    )
    op.create_index(
        "ix_saga_step_waits_key", "saga_step_waits", ["scope", "flow_key", "waiting_since"]
    )


def downgrade() -> None:
    op.drop_index("ix_saga_step_waits_key", table_name="saga_step_waits")
    op.drop_table("saga_step_waits")
    op.drop_table("saga_step_keys")
