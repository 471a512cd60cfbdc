"""The run's trace: the W3C traceparent of its root span (``celery_saga.tracing``), written
with the run's INSERT so every later span of the run, in any process, joins its trace; and
a step's, the traceparent of the forward attempt that last claimed it, written with its
claim, which its reversal's span links to. Rows stored before this revision, or with
tracing off, keep NULL.

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"


_TABLES = (
    "saga_executions",
    "saga_executions_archive",
    "saga_steps",
    "saga_steps_archive",
)


def upgrade() -> None:
    for table in _TABLES:
        op.add_column(table, sa.Column("trace_context", sa.String(64)))


def downgrade() -> None:
    for table in _TABLES:
        op.drop_column(table, "trace_context")
