"""Run three order sagas and print their timelines: completed, compensated, parked+resumed."""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator
from typing import Any

from celery_saga import Execution
from celery_saga.worker.embedded import embedded_worker
from example_project.app import app, engine
from example_project.tasks import WAREHOUSE


def timeline(title: str, execution: Execution) -> None:
    record = execution.record
    print(f"\n== {title}  [{record.id}]")
    origin = record.created_at
    events: list[tuple[Any, str]] = []
    for s in execution.steps:
        events.append((s.started_at, f"start      {s.name}"))
        if s.completed_at:
            events.append(
                (
                    s.completed_at,
                    f"{s.status.value:<10} {s.name}" + (f"  ({s.error})" if s.error else ""),
                )
            )
        if s.compensated_at and s.compensation_status:
            reason = f"  ({s.compensation_reason})" if s.compensation_reason else ""
            events.append((s.compensated_at, f"{s.compensation_status.value:<10} {s.name}{reason}"))
    for moment, text in sorted(events, key=lambda e: e[0]):
        print(f"  +{(moment - origin).total_seconds() * 1000:7.1f} ms  {text}")
    rollback = record.rollback_status.value if record.rollback_status else "-"
    print(f"  state={record.state.value}  rollback={rollback}")
    if record.failure_reason:
        print(f"  failure_reason: {record.failure_reason}")
    if record.rollback_reason:
        print(f"  rollback_reason: {record.rollback_reason}")


@contextlib.contextmanager
def worker(use_embedded: bool) -> Iterator[None]:
    if not use_embedded:
        yield
        return
    with embedded_worker(app):
        yield


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--no-worker",
        action="store_true",
        help="do not start an in-process worker (use your `celery worker`s)",
    )
    options = parser.parse_args()
    started = time.monotonic()
    items = ["book", "lamp"]
    with worker(not options.no_worker):
        done = engine.start("order", {"order_id": "A1", "items": items}).wait(20)
        timeline("1. an order that completes", done)

        failed = engine.start("order", {"order_id": "B2", "items": items, "fail_shipping": True})
        timeline("2. shipping fails: earlier steps compensated in reverse order", failed.wait(20))

        WAREHOUSE["accepts_releases"] = False
        parked = engine.start("order", {"order_id": "C3", "items": items, "fail_shipping": True})
        timeline("3a. the stock release fails too: the unwind halts and parks", parked.wait(20))
        WAREHOUSE["accepts_releases"] = True
        engine.resume_compensation(parked.id)
        timeline("3b. after resume_compensation: the unwind finishes", parked.wait(20))
    print(f"\nfinished in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
