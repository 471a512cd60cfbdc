"""Run labels (``start(..., labels=...)``), searchable by (key, value) and archived with
their run, and the bulk operations (a move applied to every run a filter selects), each
with the cursor it reached so an interrupted one resumes.

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

from celery_saga.store.migrations.shared import Timestamp, run_id

revision = "0012"
down_revision = "0011"


def upgrade() -> None:
    op.create_table(
        "saga_run_labels",
        run_id(nullable=False),
        sa.Column("key", sa.String(100), nullable=False),
        sa.Column("value", sa.String(200), nullable=False),
        sa.PrimaryKeyConstraint("execution_id", "key", name="pk_saga_run_labels"),
    )
    op.create_index(
        "ix_saga_run_labels_key_value", "saga_run_labels", ["key", "value", "execution_id"]
    )
    op.create_table(
        "saga_run_labels_archive",
        sa.Column("execution_id", sa.String(64), nullable=False),
        sa.Column("key", sa.String(100), nullable=False),
        sa.Column("value", sa.String(200), nullable=False),
        sa.PrimaryKeyConstraint("execution_id", "key", name="pk_saga_run_labels_archive"),
    )
    op.create_table(
        "saga_bulk_operations",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("move", sa.String(40), nullable=False),
        sa.Column("filter", sa.Text, nullable=False),
        sa.Column("options", sa.Text),
        sa.Column("actor", sa.String(200)),
        sa.Column("reason", sa.Text),
        sa.Column("cursor", sa.String(200)),
        sa.Column("acted", sa.Integer, nullable=False),
        sa.Column("refused", sa.Integer, nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.Column("finished_at", Timestamp),
    )


def downgrade() -> None:
    op.drop_table("saga_bulk_operations")
    op.drop_table("saga_run_labels_archive")
    op.drop_index("ix_saga_run_labels_key_value", table_name="saga_run_labels")
    op.drop_table("saga_run_labels")
