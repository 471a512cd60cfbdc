"""What the admin's pages say of their reads when they come from a read replica of the store
(``SAGA_READ_DATABASE``): how far behind it is, by the rule of ``store.replica``, read on
the admin's own connection to it (the alias its models read, not the engine's URL)."""

from __future__ import annotations

from django.db import DatabaseError, connections

from celery_saga.contrib.django.models import saga_database, saga_read_database
from celery_saga.inspect.staleness import (
    STANDING_QUERY,
    ReplicaLag,
    Standing,
    lag_of_row,
    unreadable,
)


def replica_lag() -> ReplicaLag:
    """Where the admin's reads stand: PRIMARY while they read the store's own alias."""
    alias = saga_read_database()
    if alias == saga_database():
        return ReplicaLag(Standing.PRIMARY)
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return ReplicaLag(Standing.UNKNOWN, problem=connection.vendor)
    try:
        with connection.cursor() as cursor:
            cursor.execute(STANDING_QUERY)
            names = [column[0] for column in cursor.description]
            return lag_of_row(dict(zip(names, cursor.fetchone(), strict=True)))
    except DatabaseError as error:
        return unreadable(error)
