"""Run five order sagas and a courier booking and print their timelines: approved and
completed; compensated after shipping fails; parked mid-unwind and resumed; never approved,
so it times out; cancelled by the customer while it waits for approval; and a courier
booking that holds while the courier's API is down until an operator retries it."""

from __future__ import annotations

import argparse
import contextlib
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from celery.signals import task_failure, task_retry, task_success

from celery_saga import Execution, ExecutionState, StoreConfigurationError, get_clock
from celery_saga.worker.embedded import embedded_worker
from example_project.app import app, engine
from example_project.failures import FailureLog
from example_project.sagas import APPROVAL_TIMEOUT
from example_project.tasks import COURIER_DOWN, WAREHOUSE_DOWN

#: Gate events seen in this process (the embedded worker runs here), per execution.
GATE: dict[str, list[tuple[datetime, str]]] = defaultdict(list)
#: The engine's log lines about the demo's intentional failures, per execution.
FAILURES = FailureLog()
_SHOWN = {
    "saga-waiting": "waiting    for 'approved'",
    "saga-signal-received": "signal     'approved' received",
    "saga-wait-expired": "timed out  waiting for 'approved'",
    "saga-cancelled": "cancelled  by the customer",
    "saga-held": "held       for an operator: the courier's API is down",
    "saga-hold-retried": "retried    by the operator",
}


def _on_gate(event: str, fields: dict[str, Any]) -> None:
    GATE[fields["execution_id"]].append((get_clock().now(), _SHOWN[event]))


def _events(execution: Execution, indent: str = "") -> list[tuple[datetime, str]]:
    events = [(moment, indent + text) for moment, text in GATE[execution.id]]
    events += [(moment, f"{indent}{line}") for moment, line in FAILURES.lines[execution.id]]
    for s in execution.steps:
        assert s.started_at is not None
        events.append((s.started_at, f"{indent}start      {s.name}"))
        if s.completed_at:
            error = f"  ({s.error})" if s.error and s.status.value == "failed" else ""
            events.append((s.completed_at, f"{indent}{s.status.value:<10} {s.name}{error}"))
        if s.compensated_at and s.compensation_status:
            reason = f"  ({s.compensation_reason})" if s.compensation_reason else ""
            outcome = s.compensation_status.value
            events.append((s.compensated_at, f"{indent}{outcome:<10} {s.name}{reason}"))
        if s.child_execution_id:
            events += _events(engine.get(s.child_execution_id), indent + "  | ")
    return events


def timeline(title: str, execution: Execution) -> None:
    record = execution.record
    print(f"\n== {title}  [{record.id}]")
    for moment, text in sorted(_events(execution), key=lambda e: e[0]):
        print(f"  +{(moment - record.created_at).total_seconds() * 1000:7.1f} ms  {text}")
    rollback = record.rollback_status.value if record.rollback_status else "-"
    print(f"  state={record.state.value}  rollback={rollback}")
    if record.failure_reason:
        print(f"  failure_reason: {record.failure_reason}")
    if record.rollback_reason:
        print(f"  rollback_reason: {record.rollback_reason}")


def approved(data: dict[str, Any], by: str = "maria") -> Any:
    """Start an order, approve it once it waits at the gate, and let it finish."""
    run = engine.start("order", data)
    if run.wait(20).state is ExecutionState.WAITING:
        engine.signal(run.id, "approved", {"by": by})
    return run.wait(
        20,
        states=[ExecutionState.COMPLETED, ExecutionState.FAILED, ExecutionState.COMPENSATION_STUCK],
    )


#: What Celery's own signals said about the step tasks (each step runs as its own task).
CELERY_SAW: dict[str, Counter[str]] = defaultdict(Counter)


def _count(outcome: str) -> Any:
    def handler(sender: Any = None, **_: Any) -> None:
        name = str(getattr(sender, "name", sender))
        if not name.startswith("celery_saga."):  # the engine's own tasks: waits, sweeps
            CELERY_SAW[outcome][name.rsplit(".", 1)[-1]] += 1

    return handler


for _outcome, _signal in (("success", task_success), ("failure", task_failure)):
    _signal.connect(_count(_outcome), weak=False)
task_retry.connect(_count("retry"), weak=False)


def celery_view() -> str:
    parts = []
    for outcome in ("success", "retry", "failure"):
        counts = CELERY_SAW[outcome]
        if not counts:
            continue
        names = ", ".join(f"{name} x{n}" for name, n in sorted(counts.items()))
        parts.append(f"{sum(counts.values())} task_{outcome} ({names})")
    return "Celery's signals saw the steps as their own tasks: " + "; ".join(parts)


@contextlib.contextmanager
def worker(use_embedded: bool) -> Iterator[None]:
    if not use_embedded:
        yield
        return
    with embedded_worker(app, beat=True):
        yield


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--no-worker",
        action="store_true",
        help="do not start an in-process worker and beat (use your `celery worker` and beat)",
    )
    options = parser.parse_args()
    try:  # a store URL that cannot work: its one line, before anything starts
        engine.ensure_schema()
    except StoreConfigurationError as refused:
        raise SystemExit(f"error: {refused}") from None
    for event in _SHOWN:
        engine.on(event, _on_gate)
    logging.getLogger("celery_saga").addFilter(FAILURES)
    logging.getLogger("celery.app.trace").addFilter(FAILURES)
    started = time.monotonic()
    items = ["book", "lamp"]
    WAREHOUSE_DOWN.unlink(missing_ok=True)  # left by an interrupted earlier demo
    COURIER_DOWN.unlink(missing_ok=True)
    with worker(not options.no_worker):
        done = approved({"order_id": "A1", "items": items})
        timeline("1. approved: reserved item by item, paid in a nested saga, shipped", done)

        failed = approved({"order_id": "B2", "items": items, "fail_shipping": True})
        timeline("2. shipping fails: the payment saga and each item reversed, in reverse", failed)

        WAREHOUSE_DOWN.touch()
        try:
            parked = approved({"order_id": "C3", "items": items, "fail_shipping": True})
            timeline("3a. releasing an item fails too: the unwind halts and parks", parked)
        finally:
            WAREHOUSE_DOWN.unlink(missing_ok=True)
        engine.resume_compensation(parked.id)
        resumed = engine.handle(parked.id).wait(20, states=[ExecutionState.FAILED])
        timeline("3b. after resume_compensation: the unwind finishes", resumed)

        late = engine.start("order", {"order_id": "D4", "items": items})
        late.wait(20)  # waiting at the gate; nobody approves
        expired = late.wait(APPROVAL_TIMEOUT + 20, states=[ExecutionState.FAILED])
        timeline(
            f"4. nobody approves within {APPROVAL_TIMEOUT:g} s: beat fails and unwinds it", expired
        )

        withdrawn = engine.start("order", {"order_id": "E5", "items": items})
        withdrawn.wait(20)  # waiting for approval, the customer withdraws the order
        engine.cancel(withdrawn.id, "the customer withdrew order E5")
        cancelled = withdrawn.wait(20, states=[ExecutionState.CANCELLED])
        timeline("5. the customer cancels while it waits: what was done is unwound", cancelled)

        COURIER_DOWN.touch()
        try:
            pickup = engine.start("courier", {"order_id": "F6"})
            pickup.wait(20)  # held: booking failed for good while the courier is down
        finally:
            COURIER_DOWN.unlink(missing_ok=True)
        engine.retry(pickup.id, actor="ops", reason="the courier's API is back")
        booked = pickup.wait(20, states=[ExecutionState.COMPLETED])
        timeline(
            "6. the courier's API is down: the booking holds until the operator retries", booked
        )
    print(f"\n{celery_view()}")
    print(f"finished in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
