"""Only what ``manage.py saga`` needs: the app, and where the project's Celery app lives."""

SECRET_KEY = "test-only"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["celery_saga.contrib.django"]
DATABASES: dict[str, dict[str, str]] = {}
#: The Celery app the behaviour suite's workers run (built from SAGA_TEST_* variables).
SAGA_CELERY_APP = "tests.sagaapp:app"
