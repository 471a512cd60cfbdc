"""A run's history records each step attempt: when it began, beside when it ended.

The rows a step attempt writes (``step-completed``, ``step-failed``, ``step-retrying``,
``step-lost``, ``step-released``) carry their end in ``at`` and their start in
``started_at``; every other row leaves it NULL. Rows stored before this revision keep NULL.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

from celery_saga.store.migrations.types import Timestamp

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

TABLES = ("saga_history", "saga_history_archive")
#: Microseconds on MySQL/MariaDB too, as every other stored time.


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("started_at", Timestamp))


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("started_at")
