"""The ``celery saga`` command group (entry point ``celery.commands``: ``saga``)."""

from celery_saga.cli import db as _db  # noqa: F401  (registers the ``db`` subgroup)
from celery_saga.cli.commands import saga

__all__ = ["saga"]
