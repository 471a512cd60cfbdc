"""The web view (``celery -A proj saga web``, the ``web`` extra): runs and their stories in
a browser, with operator actions when enabled. Flask renders the pages on the server; no
script, stylesheet or font is loaded from anywhere else."""

from celery_saga.web.app import create_app
from celery_saga.web.settings import Credentials, WebSettings

__all__ = ["Credentials", "WebSettings", "create_app"]
