"""The ``celery saga`` command group (entry point ``celery.commands``: ``saga``)."""

from celery_saga.cli import db as _db  # noqa: F401  (registers the ``db`` subgroup)
from celery_saga.cli import held as _held  # noqa: F401  (retry, skip, unwind)
from celery_saga.cli import limits as _limits  # noqa: F401  (``limits``: flow-control keys)
from celery_saga.cli import operate as _operate  # noqa: F401  (signal, resume, abandon, cancel)
from celery_saga.cli import pauses as _pauses  # noqa: F401  (pause, unpause, pauses)
from celery_saga.cli import payload_keys as _payload_keys  # noqa: F401  (``db new-key``, ``db reencrypt``)
from celery_saga.cli import version_check as _version_check  # noqa: F401  (``versions check``)
from celery_saga.cli import versions as _versions  # noqa: F401  (``versions``, ``upgrade``)
from celery_saga.cli import web as _web  # noqa: F401  (``web``: the web extra, imported lazily)
from celery_saga.cli.commands import saga

__all__ = ["saga"]
