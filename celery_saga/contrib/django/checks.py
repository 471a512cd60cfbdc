"""``manage.py check`` says when the admin's models would read a database Django lacks (the
store's alias, or its read replica's)."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.checks import Error, register

from celery_saga.contrib.django.models import saga_database, saga_read_database


@register()  # type: ignore[untyped-decorator]
def saga_database_is_configured(app_configs: Any, **kwargs: Any) -> list[Error]:
    # Without the admin, nothing reads the models: ``manage.py saga`` needs no database.
    if not apps.is_installed("django.contrib.admin"):
        return []
    aliases = (
        (
            "SAGA_DATABASE",
            saga_database(),
            "Add an alias for the saga store's database (the one CELERY_SAGA_STORE_URL names) "
            "and set SAGA_DATABASE to it.",
            "celery_saga.E001",
        ),
        (
            "SAGA_READ_DATABASE",
            saga_read_database(),
            "Add an alias for the read replica of the saga store (the one "
            "CELERY_SAGA_READ_STORE_URL names) and set SAGA_READ_DATABASE to it.",
            "celery_saga.E002",
        ),
    )
    return [
        Error(f"{setting} is {alias!r}, which is not an alias of DATABASES", hint=hint, id=code)
        for setting, alias, hint, code in aliases
        if alias not in settings.DATABASES
    ]
