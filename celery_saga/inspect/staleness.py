"""How stale a view's reads are, for a view that reads a replica on a connection of its own
(the Django admin reads its ``SAGA_READ_DATABASE`` alias): the rule of ``store.replica``,
offered where views may take it."""

from celery_saga.store.replica import STANDING_QUERY, ReplicaLag, Standing, lag_of_row, unreadable

__all__ = ["STANDING_QUERY", "ReplicaLag", "Standing", "lag_of_row", "unreadable"]
