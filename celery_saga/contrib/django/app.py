"""Which Celery app ``manage.py saga`` operates on."""

from __future__ import annotations

from celery import Celery, current_app
from django.conf import settings
from django.utils.module_loading import import_string

from celery_saga.errors import SagaError
from celery_saga.worker.engine import SagaEngine


def project_celery_app() -> Celery:
    """``settings.SAGA_CELERY_APP`` ("proj.celery.app" or "proj.celery:app"), else the app
    Celery considers current: the one a Django project's ``proj/__init__.py`` imports."""
    path = getattr(settings, "SAGA_CELERY_APP", None)
    if not path:
        app: Celery = current_app._get_current_object()
        return app
    try:
        app = import_string(str(path).replace(":", "."))
    except ImportError as error:
        raise SagaError(f"SAGA_CELERY_APP = {path!r} cannot be imported: {error}") from None
    if not isinstance(app, Celery):
        raise SagaError(f"SAGA_CELERY_APP = {path!r} is a {type(app).__name__}, not a Celery app")
    return app


def project_engine() -> SagaEngine | None:
    """The project's ``SagaEngine``, or None while there is none to find yet (no Celery app
    configured, or one without an engine): ``manage.py saga`` then says why."""
    try:
        app = project_celery_app()
    except SagaError:
        return None
    engine = getattr(app, "saga_engine", None)
    return engine if isinstance(engine, SagaEngine) else None
