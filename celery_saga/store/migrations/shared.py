"""What the revisions share: their column types, and adding or dropping columns on a few
tables at once. A revision's effect never changes once released, so neither does anything
here: a column that needs another type gets a new name."""

from collections.abc import Iterable, Mapping
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

Blob = sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
#: Microseconds on MySQL/MariaDB too.
Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
RecordId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def run_id(**options: Any) -> sa.Column:  # type: ignore[type-arg]
    """The ``execution_id`` column of a run's child table, whose rows go with the run."""
    return sa.Column(
        "execution_id",
        sa.String(64),
        sa.ForeignKey("saga_executions.id", ondelete="CASCADE"),
        **options,
    )


#: Where a run's row is: live, and archived.
RUN_TABLES = ("saga_executions", "saga_executions_archive")


def add_columns(tables: Iterable[str], columns: Mapping[str, Any]) -> None:
    """Add the nullable ``columns`` (name: type) to each of ``tables``, in that order."""
    for table in tables:
        with op.batch_alter_table(table) as batch:
            for name, kind in columns.items():
                batch.add_column(sa.Column(name, kind))


def drop_columns(tables: Iterable[str], names: Iterable[str]) -> None:
    """Drop the columns ``names`` from each of ``tables``, in that order."""
    for table in tables:
        with op.batch_alter_table(table) as batch:
            for name in names:
                batch.drop_column(name)
