"""Django integration: add ``"celery_saga.contrib.django"`` to ``INSTALLED_APPS`` and
``python manage.py saga <command>`` runs the ``celery saga`` commands with the project's
Celery app (the ``SAGA_CELERY_APP`` setting, else Celery's current app). Needs the
``django`` extra."""
