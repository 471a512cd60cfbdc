"""``manage.py check`` says when the admin's models would read a database Django lacks."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.checks import Error, register

from celery_saga.contrib.django.models import saga_database


@register()  # type: ignore[untyped-decorator]
def saga_database_is_configured(app_configs: Any, **kwargs: Any) -> list[Error]:
    alias = saga_database()
    # Without the admin, nothing reads the models: ``manage.py saga`` needs no database.
    if alias in settings.DATABASES or not apps.is_installed("django.contrib.admin"):
        return []
    return [
        Error(
            f"SAGA_DATABASE is {alias!r}, which is not an alias of DATABASES",
            hint="Add an alias for the saga store's database (the one CELERY_SAGA_STORE_URL "
            "names) and set SAGA_DATABASE to it.",
            id="celery_saga.E001",
        )
    ]
