"""Parallel groups join on counts kept on the run row, not on a read of every member.

``members_settled`` and ``members_failed`` count the members of the parallel group at the
run's cursor that have settled, and how many of those failed; the member that brings
``members_settled`` to the group's size joins it. Runs stored before this revision keep
NULL: their next member to settle counts the group's records once and stores the counts.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa

from celery_saga.store.migrations.shared import RUN_TABLES, add_columns, drop_columns

revision = "0008"
down_revision = "0007"

COLUMNS = ("members_settled", "members_failed")


def upgrade() -> None:
    add_columns(RUN_TABLES, dict.fromkeys(COLUMNS, sa.Integer))


def downgrade() -> None:
    drop_columns(RUN_TABLES, COLUMNS)
