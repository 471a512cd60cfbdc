"""Helpers for testing sagas: a controllable clock (guarantee 25), an in-process engine on
SQLite, a helper that runs a saga to its end and returns its timeline, and ``explore``,
which fails a saga at every point and checks the guarantees at each.

Installed as a pytest plugin (``pytest11`` entry point): the fixtures ``saga_clock``,
``saga_celery_app``, ``saga_engine`` and ``saga_kit`` are there in every test of a project
that has this package installed. See ``docs/testing.md``.
"""

from celery_saga.testing.clock import ControlledClock
from celery_saga.testing.explorer import explore
from celery_saga.testing.kit import SagaKit, Timeline, timeline_of
from celery_saga.testing.points import Fault, Point
from celery_saga.testing.report import ExplorationReport, PointFailure

__all__ = [
    "ControlledClock",
    "ExplorationReport",
    "Fault",
    "Point",
    "PointFailure",
    "SagaKit",
    "Timeline",
    "explore",
    "timeline_of",
]
