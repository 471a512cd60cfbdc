"""Each version's shape beside the version: the JSON text its structural hash is taken of,
one row per saga and hash, written by the first process that starts a run on it or starts
a worker with it. A process without the version's code then judges its runs with it
(``upgrade``, ``saga versions check``). Versions of runs stored before this revision get
their row when a process with their code next starts; until then the check names them.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from celery_saga.store.migrations.shared import Timestamp, version_columns

revision = "0010"
down_revision = "0009"

#: MySQL's TEXT stops at 64 KiB; a saga of many steps has a longer shape.
ShapeText = sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        "saga_version_shapes",
        *version_columns(),
        sa.Column("shape", ShapeText, nullable=False),
        sa.Column("recorded_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("saga_name", "definition_hash", name="pk_saga_version_shapes"),
    )


def downgrade() -> None:
    op.drop_table("saga_version_shapes")
