"""Which lookups the admin's lists take from their URL: their filters' own parameters, and
nothing else, for every user (superusers too).

Django narrows a list by any lookup on the model's own columns, so ``?input__contains=``
(PostgreSQL compares the bytea's hex text) or ``?input__regex=`` (SQLite) asked yes/no
questions of a payload the page shows as ``[redacted]``, and read it back a character at a
time. A lookup no filter reads is refused as Django refuses one it disallows: a 400, nothing
queried."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest


def filter_parameters(model_admin: Any, request: HttpRequest | None) -> frozenset[str]:
    """The query parameters ``model_admin``'s list filters read: what Django's filter for a
    listed field name expects (its value, its ``__isnull``), and a ``SimpleListFilter``'s
    ``parameter_name``."""
    parameters: set[str] = set()
    for entry in model_admin.list_filter:
        if not isinstance(entry, str):
            parameters.add(str(entry.parameter_name))
            continue
        field = model_admin.model._meta.get_field(entry)
        # Building the filter runs no query: its choices are read when the page is drawn.
        spec = admin.FieldListFilter.create(
            field, request, {}, model_admin.model, model_admin, field_path=entry
        )
        parameters.update(spec.expected_parameters())
    return frozenset(parameters)


def only_filter_lookups(
    model_admin: Any, lookup: str, value: Any, request: HttpRequest | None = None
) -> bool:
    """``ModelAdmin.lookup_allowed``: only a parameter one of the list's filters reads
    (tests/test_django_admin.py::test_no_lookup_in_the_url_reads_a_payload_column_for_any_user)."""
    return lookup in filter_parameters(model_admin, request)
