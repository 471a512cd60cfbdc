"""The column types the revisions share. A revision's effect never changes once released,
so neither does a type here: a column that needs another type gets a new name."""

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

Blob = sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
RecordId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
