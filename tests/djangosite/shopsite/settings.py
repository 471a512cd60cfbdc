"""Settings of the minimal project; broker, store and queue come from the test."""

import os

SECRET_KEY = "test-only"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["testserver"]
ROOT_URLCONF = "shopsite.urls"
INSTALLED_APPS = ["celery_saga.contrib.django", "orders"]
DATABASES: dict[str, dict[str, str]] = {}

CELERY_BROKER_URL = os.environ["SHOP_BROKER"]
CELERY_TASK_DEFAULT_QUEUE = os.environ["SHOP_QUEUE"]
CELERY_SAGA_STORE_URL = os.environ["SHOP_STORE"]
