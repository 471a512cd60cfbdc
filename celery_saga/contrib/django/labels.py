"""The admin's search by label: ``label.KEY=VALUE`` in the runs' search box."""

from __future__ import annotations

from typing import Any

from django.db import connections
from django.db.models import QuerySet

from celery_saga.contrib.django.models import saga_read_database
from celery_saga.errors import SagaError
from celery_saga.run_filter import parse_where


def labelled(queryset: QuerySet[Any], term: str) -> QuerySet[Any]:
    """The runs carrying the label ``term`` names (``label.KEY=VALUE``), a seek on the
    labels' (key, value) index; none for a term that names no storable label."""
    try:
        ((key, value),) = parse_where([term]).labels
    except SagaError:
        return queryset.none()
    quote = connections[saga_read_database()].ops.quote_name  # MySQL reserves KEY
    labelled = (
        f"id IN (SELECT execution_id FROM saga_run_labels WHERE {quote('key')} = %s "
        f"AND {quote('value')} = %s)"
    )
    return queryset.extra(where=[labelled], params=[key, value])
