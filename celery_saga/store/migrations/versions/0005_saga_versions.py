"""Versions side by side: where each version of a saga is deployed, and which runs wait for
a worker that has their version.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

from celery_saga.store.migrations.shared import Timestamp, run_id, version_columns

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    op.create_table(
        "saga_versions",
        *version_columns(),
        sa.Column("seen_by", sa.String(200), nullable=False),
        sa.Column("first_seen", Timestamp, nullable=False),
        sa.Column("last_seen", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint(
            "saga_name", "definition_hash", "seen_by", name="pk_saga_versions"
        ),
    )
    op.create_table(
        "saga_version_waits",
        run_id(nullable=False),
        sa.Column("definition_hash", sa.String(64), nullable=False),
        sa.Column("handed_back_by", sa.String(200), nullable=False),
        sa.Column("handed_back_at", Timestamp, nullable=False),
        sa.Column("times", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("execution_id"),
    )


def downgrade() -> None:
    op.drop_table("saga_version_waits")
    op.drop_table("saga_versions")
