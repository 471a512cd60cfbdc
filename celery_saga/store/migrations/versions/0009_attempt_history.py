"""A run's history records each step attempt: when it began, beside when it ended.

The rows a step attempt writes (``step-completed``, ``step-failed``, ``step-retrying``,
``step-lost``, ``step-released``) carry their end in ``at`` and their start in
``started_at``; every other row leaves it NULL. Rows stored before this revision keep NULL.

Revision ID: 0009
Revises: 0008
"""

from celery_saga.store.migrations.shared import Timestamp, add_columns, drop_columns

revision = "0009"
down_revision = "0008"

TABLES = ("saga_history", "saga_history_archive")


def upgrade() -> None:
    add_columns(TABLES, {"started_at": Timestamp})


def downgrade() -> None:
    drop_columns(TABLES, ("started_at",))
