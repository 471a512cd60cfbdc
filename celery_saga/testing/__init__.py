"""Helpers for testing sagas: a controllable clock (guarantee 25), an in-process engine on
SQLite, and a helper that runs a saga to its end and returns its timeline.

Installed as a pytest plugin (``pytest11`` entry point): the fixtures ``saga_clock``,
``saga_celery_app``, ``saga_engine`` and ``saga_kit`` are there in every test of a project
that has this package installed. See ``docs/testing.md``.
"""

from celery_saga.testing.clock import ControlledClock
from celery_saga.testing.kit import SagaKit, Timeline, timeline_of

__all__ = ["ControlledClock", "SagaKit", "Timeline", "timeline_of"]
