"""Paused steps (issue 42): an operator's pause of a step or of a whole saga, which the step
claim refuses to pass, and the runs held at a paused step's door until it is unpaused.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

from celery_saga.store.migrations.shared import Timestamp, run_id

revision = "0011"
down_revision = "0010"


def upgrade() -> None:
    op.create_table(
        "saga_pauses",
        sa.Column("saga_name", sa.String(200), nullable=False),
        sa.Column("step_name", sa.String(200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("actor", sa.String(200)),
        sa.Column("paused_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("saga_name", "step_name", name="pk_saga_pauses"),
    )
    op.create_table(
        "saga_paused_runs",
        run_id(primary_key=True),
        sa.Column("saga_name", sa.String(200), nullable=False),
        sa.Column("pause_step", sa.String(200), nullable=False),
        sa.Column("step_name", sa.String(200), nullable=False),
        sa.Column("held_at", Timestamp, nullable=False),
    )
    op.create_index(
        "ix_saga_paused_runs_pause", "saga_paused_runs", ["saga_name", "pause_step", "held_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_saga_paused_runs_pause", table_name="saga_paused_runs")
    op.drop_table("saga_paused_runs")
    op.drop_table("saga_pauses")
