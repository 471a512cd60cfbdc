"""The app of the tracing tests' worker processes: the test app (``tests.sagaapp``) with
the sagas ``traced``, ``traced_kid`` and ``traced_park``, and an SDK tracer provider that
writes every finished span to files (``tracing_kit.trace_to_files``). With
``SAGA_TEST_CLOCK_SHIFT`` (a file), the package's clock is the system's moved by the
seconds written there, so a test moves the time of every process at once."""

from __future__ import annotations

import os
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

from celery_saga import Saga, set_clock
from tests.sagaapp import TestApp, from_environment
from tests.tracing_kit import trace_to_files


def define_traced(test_app: TestApp) -> None:
    """Five steps (the 4th retried once on failure) around a sub-saga and a wait; and
    three whose unwind parks when a switch makes the first one's reversal fail."""
    fwd, rev = test_app.forward, test_app.reverse
    test_app.engine.register(
        Saga("traced_kid").step("k1", fwd, compensate=rev),
        Saga("traced")
        .step("t1", fwd, compensate=rev)
        .step("t2", fwd, compensate=rev)
        .sub_saga("traced_kid")
        .wait_for("go", timeout=120)
        .step("t3", fwd, compensate=rev)
        .step("t4", fwd, compensate=rev, retry=2, backoff=0.5)
        .step("t5", fwd),
        Saga("traced_park")
        .step("p1", fwd, compensate=rev, compensation_retry=1)
        .step("p2", fwd, compensate=rev)
        .step("p3", fwd),
    )


class ShiftedClock:
    """The system's time moved by the seconds written in ``path`` (none: not moved)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def now(self) -> datetime:
        written = self.path.read_text().strip() if self.path.exists() else ""
        return datetime.now(timezone.utc) + timedelta(seconds=float(written or 0))

    def random(self) -> float:
        return random.random()


trace_to_files()
if os.environ.get("SAGA_TEST_CLOCK_SHIFT"):
    set_clock(ShiftedClock(os.environ["SAGA_TEST_CLOCK_SHIFT"]))
if "SAGA_TEST_BROKER" in os.environ:
    _test_app = from_environment()
    define_traced(_test_app)
    app = _test_app.app
