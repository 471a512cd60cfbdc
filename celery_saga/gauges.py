"""Prometheus gauges read from the saga store, for alerts on what is stuck or piling up:
unfinished runs by saga and state (``waiting`` and ``compensation_stuck`` above all), the
age of the oldest unfinished run of each saga, of its oldest run queued by a flow-control
limit (the queue's length is ``saga_runs{state="queued"}``), how long the longest held run
of each saga has been held, and the paused steps with the runs they hold (needs the
``prometheus`` extra).

The counters of ``metrics`` say what happened in one process; these say what the store
holds now, so every exporter reports the same values (aggregate them with ``max``, not
``sum``). A thread reads the store every ``every`` seconds, from the indexes on state
(unfinished runs only: the cost does not grow with history); a scrape never waits on the
store: it serves the last reading, and ``saga_store_up`` says whether that reading is fresh.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from celery_saga.records import ExecutionState, Pause
from celery_saga.runtime.clock import get_clock
from celery_saga.store import inspection, pauses, step_lines
from celery_saga.store.database import Database

logger = logging.getLogger("celery_saga")


@dataclass(frozen=True)
class Reading:
    #: (saga, state) -> unfinished runs
    runs: dict[tuple[str, str], int] = field(default_factory=dict)
    #: saga -> creation time of its oldest unfinished run
    oldest: dict[str, datetime] = field(default_factory=dict)
    #: saga -> creation time of its oldest queued run (flow control: the longest wait)
    oldest_queued: dict[str, datetime] = field(default_factory=dict)
    at: datetime | None = None
    #: saga -> since when its longest held run has been held
    held_since: dict[str, datetime] = field(default_factory=dict)
    #: the stored pauses (each with how many runs it holds at its door)
    pauses: tuple[Pause, ...] = ()
    #: saga -> (its steps waiting at a limited step's door, since when the longest waits)
    at_doors: dict[str, tuple[int, datetime]] = field(default_factory=dict)


class StoreGauges(Collector):
    """A collector serving the last ``Reading`` of the store; ``start()`` keeps it fresh."""

    def __init__(self, db: Database, every: float = 15.0, prefix: str = "saga") -> None:
        self.db, self.every, self.prefix = db, every, prefix
        self.reading = Reading()
        self.up = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._keep, name="saga-gauges", daemon=True)
            self._thread.start()

    def _keep(self) -> None:
        while True:
            self.refresh()
            time.sleep(self.every)

    def refresh(self) -> None:
        """Read the store once; a failure keeps the last reading and marks the store down."""
        try:
            runs = inspection.run_counts(self.db)
            oldest = inspection.oldest_unfinished_by_saga(self.db)
            held = inspection.longest_held_by_saga(self.db)
            paused = tuple(pauses.list_pauses(self.db))
            queued = (ExecutionState.QUEUED.value,)
            oldest_queued = inspection.oldest_unfinished_by_saga(self.db, queued)
            at_doors = step_lines.lines_by_saga(self.db)
        except Exception as error:  # an outage must not end the thread
            if self.up:
                logger.warning("saga gauges: the store could not be read (%s)", error)
            self.up = False
            return
        at = get_clock().now()
        self.reading = Reading(runs, oldest, oldest_queued, at, held, paused, at_doors)
        self.up = True

    def collect(self) -> Iterator[Metric]:
        reading, prefix = self.reading, self.prefix
        runs = GaugeMetricFamily(
            f"{prefix}_runs",
            "Unfinished runs in the store, by saga and state",
            labels=["saga", "state"],
        )
        for (saga, state), count in sorted(reading.runs.items()):
            runs.add_metric([saga, state], count)
        yield runs
        yield _ages(
            f"{prefix}_oldest_unfinished_run_age_seconds",
            "Age of the oldest unfinished run of each saga",
            reading.oldest,
            reading.at,
        )
        yield _ages(
            f"{prefix}_oldest_queued_run_age_seconds",
            "How long the oldest run of each saga queued by its flow-control limit has waited",
            reading.oldest_queued,
            reading.at,
        )
        yield _ages(
            f"{prefix}_oldest_held_run_age_seconds",
            "How long the longest held run of each saga has waited for an operator",
            reading.held_since,
            reading.at,
        )
        yield from _paused(reading.pauses, prefix)
        waiting = GaugeMetricFamily(
            f"{prefix}_steps_at_door",
            "Steps of each saga waiting at a limited step's door (concurrency= or rate=)",
            labels=["saga"],
        )
        for saga, (count, _) in sorted(reading.at_doors.items()):
            waiting.add_metric([saga], count)
        yield waiting
        yield _ages(
            f"{prefix}_oldest_step_at_door_age_seconds",
            "How long the longest step of each saga waiting at a limited step's door has waited",
            {saga: since for saga, (_, since) in reading.at_doors.items()},
            reading.at,
        )
        yield GaugeMetricFamily(
            f"{prefix}_store_up",
            "1 if the last reading of the store for these gauges succeeded",
            value=1.0 if self.up else 0.0,
        )


def _ages(name: str, documentation: str, since: dict[str, datetime], at: datetime | None) -> Metric:
    """A gauge by saga of the seconds from each saga's ``since`` to the reading (``at``)."""
    gauge = GaugeMetricFamily(name, documentation, labels=["saga"])
    if at is not None:
        for saga, then in sorted(since.items()):
            gauge.add_metric([saga], max(0.0, (at - then).total_seconds()))
    return gauge


def _paused(stored: tuple[Pause, ...], prefix: str) -> Iterator[Metric]:
    """Paused steps by saga (an alert on one left paused), and the runs each holds at its
    door (``step`` "*": a pause of the whole saga)."""
    steps = GaugeMetricFamily(
        f"{prefix}_paused_steps", "Paused steps (and whole sagas) of each saga", labels=["saga"]
    )
    held = GaugeMetricFamily(
        f"{prefix}_paused_held_runs",
        "Runs held at the door of each paused step",
        labels=["saga", "step"],
    )
    counted: dict[str, int] = {}
    for pause in stored:
        counted[pause.saga] = counted.get(pause.saga, 0) + 1
        held.add_metric([pause.saga, pause.step or "*"], pause.held)
    for saga, count in sorted(counted.items()):
        steps.add_metric([saga], count)
    yield steps
    yield held
