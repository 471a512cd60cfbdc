"""The ``celery saga`` command group (entry point ``celery.commands``: ``saga``)."""

from celery_saga.cli import db as _db  # noqa: F401  (registers the ``db`` subgroup)
from celery_saga.cli import versions as _versions  # noqa: F401  (``versions``, ``upgrade``)
from celery_saga.cli.commands import saga

__all__ = ["saga"]
