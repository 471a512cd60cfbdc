"""Settings of the minimal project; broker, store and queue come from the test.

Django's own tables (users, sessions) live in the saga store's database, as in most
projects; with ``SHOP_DJANGO_DB`` (a SQLite file) they live there instead and the store is
the ``sagas`` alias, named by ``SAGA_DATABASE``; with ``SHOP_READ_STORE``, the admin reads
the saga tables from that replica of the store (``SAGA_READ_DATABASE``)."""

import os

from sqlalchemy.engine import make_url

SECRET_KEY = "test-only"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["testserver"]
ROOT_URLCONF = "shopsite.urls"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "celery_saga.contrib.django",
    "orders",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]


def _django_database(store_url: str) -> dict[str, str]:
    """The saga store's database as Django names it."""
    url = make_url(store_url)
    if url.get_backend_name() == "sqlite":
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": str(url.database)}
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": str(url.database),
        "USER": str(url.username or ""),
        "PASSWORD": str(url.password or ""),
        "HOST": str(url.host or ""),
        "PORT": str(url.port or ""),
    }


CELERY_BROKER_URL = os.environ["SHOP_BROKER"]
CELERY_TASK_DEFAULT_QUEUE = os.environ["SHOP_QUEUE"]
CELERY_SAGA_STORE_URL = os.environ["SHOP_STORE"]
CELERY_TASK_ALWAYS_EAGER = os.environ.get("SHOP_EAGER") == "1"

if os.environ.get("SHOP_DJANGO_DB"):
    DATABASES = {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["SHOP_DJANGO_DB"]},
        "sagas": _django_database(CELERY_SAGA_STORE_URL),
    }
    SAGA_DATABASE = "sagas"
else:
    DATABASES = {"default": _django_database(CELERY_SAGA_STORE_URL)}

if os.environ.get("SHOP_READ_STORE"):
    # A read replica of the store: the engine's operator reads and the admin's pages use it.
    CELERY_SAGA_READ_STORE_URL = os.environ["SHOP_READ_STORE"]
    DATABASES["replica"] = _django_database(CELERY_SAGA_READ_STORE_URL)
    SAGA_READ_DATABASE = "replica"
