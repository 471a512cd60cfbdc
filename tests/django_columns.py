"""Prints, as JSON, the columns the Django app's unmanaged models declare, and those its
Django migrations leave them with. ``makemigrations --check`` cannot tell them apart:
Django tracks no field change of an unmanaged model, so a field added to one is in no
migration unless one is written by hand.

Run in a process of its own (tests/test_django_models.py): ``django.setup()`` configures
Django for the whole process, once.
"""

from __future__ import annotations

import json
from typing import Any

import django
from django.conf import settings


def _column(field: Any) -> dict[str, Any]:
    """A field as the table sees it: its type (a foreign key's is its target's), nullable,
    and the length of a string."""
    typed = field.target_field if field.is_relation else field
    return {
        "kind": typed.get_internal_type(),
        "nullable": bool(field.null),
        "length": typed.max_length,
    }


def _tables(models: Any) -> dict[str, dict[str, dict[str, Any]]]:
    return {
        model._meta.db_table: {f.column: _column(f) for f in model._meta.concrete_fields}
        for model in models
    }


def main() -> None:
    settings.configure(
        INSTALLED_APPS=[
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "celery_saga.contrib.django",
        ],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        USE_TZ=True,
    )
    django.setup()
    from django.apps import apps
    from django.db.migrations.loader import MigrationLoader

    migrated = MigrationLoader(None, ignore_no_migrations=True).project_state().apps
    seen = {
        "tables": _tables(apps.get_app_config("celery_saga").get_models()),
        "migrated": _tables(migrated.get_app_config("celery_saga").get_models()),
    }
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
