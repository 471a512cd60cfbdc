from __future__ import annotations

from django.apps import AppConfig


class CelerySagaConfig(AppConfig):  # type: ignore[misc]
    name = "celery_saga.contrib.django"
    label = "celery_saga"
    verbose_name = "Celery sagas"
