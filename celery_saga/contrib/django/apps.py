from __future__ import annotations

from django.apps import AppConfig, apps


class CelerySagaConfig(AppConfig):  # type: ignore[misc]
    name = "celery_saga.contrib.django"
    label = "celery_saga"
    verbose_name = "Celery sagas"

    def ready(self) -> None:
        """Import each installed app's ``sagas`` module, so a web process or ``manage.py
        shell`` knows every saga as a worker does (tests/test_django_discovery.py)."""
        from celery_saga.contrib.django import checks  # noqa: F401  (registers them)
        from celery_saga.contrib.django.app import project_engine

        engine = project_engine()
        if engine is not None:
            engine.autodiscover_sagas(
                [config.name for config in apps.get_app_configs()], force=True
            )
