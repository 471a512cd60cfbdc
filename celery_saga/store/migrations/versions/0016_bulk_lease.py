"""One process at a time carries out a bulk operation: ``holder`` names it, and
``lease_until`` how long its hold lasts unless it renews it (``decisions.bulk_lease``).
Operations stored before this revision have no holder: the first process to resume one
takes it.

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
from alembic import op

from celery_saga.store.migrations.shared import Timestamp

revision = "0016"
down_revision = "0015"


def upgrade() -> None:
    op.add_column("saga_bulk_operations", sa.Column("holder", sa.String(200)))
    op.add_column("saga_bulk_operations", sa.Column("lease_until", Timestamp))


def downgrade() -> None:
    op.drop_column("saga_bulk_operations", "lease_until")
    op.drop_column("saga_bulk_operations", "holder")
