"""Who holds a claim, and a run's history.

``holder`` / ``compensation_holder`` name the worker process that holds a step's claim
(its Celery node name, process id and task id): a takeover asks that worker first, and its
main process gives up the claims of a pool process that died. ``saga_history`` is the
append-only story of a run, kept and archived with it.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

from celery_saga.store.migrations.shared import (
    Blob,
    RecordId,
    Timestamp,
    add_columns,
    drop_columns,
    run_id,
)

revision = "0004"
down_revision = "0003"

HOLDERS = ("holder", "compensation_holder")


def _history_columns(archive: bool) -> list[sa.Column]:  # type: ignore[type-arg]
    execution = (
        sa.Column("execution_id", sa.String(64), nullable=False)
        if archive
        else run_id(nullable=False)
    )
    return [
        sa.Column("id", RecordId, nullable=False, autoincrement=not archive),
        execution,
        sa.Column("at", Timestamp, nullable=False),
        sa.Column("kind", sa.String(40), nullable=False),
        sa.Column("step", sa.String(200)),
        sa.Column("attempt", sa.Integer),
        sa.Column("holder", sa.String(200)),
        sa.Column("actor", sa.String(200)),
        sa.Column("detail", sa.Text),
        sa.Column("data", Blob),
    ]


def upgrade() -> None:
    add_columns(("saga_steps", "saga_steps_archive"), dict.fromkeys(HOLDERS, sa.String(200)))
    op.create_table("saga_history", *_history_columns(False), sa.PrimaryKeyConstraint("id"))
    op.create_index("ix_saga_history_execution", "saga_history", ["execution_id", "id"])
    op.create_table(
        "saga_history_archive",
        *_history_columns(True),
        sa.PrimaryKeyConstraint("execution_id", "id", name="pk_saga_history_archive"),
    )


def downgrade() -> None:
    op.drop_table("saga_history_archive")
    op.drop_table("saga_history")  # its index goes with it (MySQL keeps it for the key)
    drop_columns(("saga_steps", "saga_steps_archive"), HOLDERS)
