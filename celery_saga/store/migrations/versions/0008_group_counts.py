"""Parallel groups join on counts kept on the run row, not on a read of every member.

``members_settled`` and ``members_failed`` count the members of the parallel group at the
run's cursor that have settled, and how many of those failed; the member that brings
``members_settled`` to the group's size joins it. Runs stored before this revision keep
NULL: their next member to settle counts the group's records once and stores the counts.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

COLUMNS = ("members_settled", "members_failed")


def upgrade() -> None:
    for table in ("saga_executions", "saga_executions_archive"):
        with op.batch_alter_table(table) as batch:
            for name in COLUMNS:
                batch.add_column(sa.Column(name, sa.Integer))


def downgrade() -> None:
    for table in ("saga_executions", "saga_executions_archive"):
        with op.batch_alter_table(table) as batch:
            for name in COLUMNS:
                batch.drop_column(name)
