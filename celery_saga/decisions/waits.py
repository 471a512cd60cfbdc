"""Wait and signal decisions (guarantees 13-15).

The store takes the run's row lock before asking these, so a signal and the run parking
itself are decided one after the other, never on the same stale snapshot.
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum

from celery_saga.records import ExecutionRecord, ExecutionState


class Arrival(str, Enum):
    PARK = "park"  # no signal yet: park with the deadline
    PASS = "pass"  # the signal is already there: move past the gate
    REFUSE = "refuse"  # the message is not for the run's current position


def decide_arrival(
    execution: ExecutionRecord | None,
    node: int,
    deployed_hash: str,
    signal_received: bool,
) -> Arrival:
    """A run's wait message arrives at gate ``node``."""
    if (
        execution is None
        or execution.state is not ExecutionState.RUNNING
        or execution.definition_hash != deployed_hash
        or (execution.cursor, execution.cursor_sub) != (node, 0)
    ):
        return Arrival.REFUSE
    return Arrival.PASS if signal_received else Arrival.PARK


class SignalVerdict(str, Enum):
    RESUME = "resume"  # the run is parked at this event's gate: this signal resumes it
    STORE = "store"  # recorded for the gate the run has not reached yet
    DUPLICATE = "duplicate"
    NOT_ACCEPTING = "not_accepting"  # terminal, compensating or parked mid-unwind


def decide_signal(execution: ExecutionRecord, gate: int, already_received: bool) -> SignalVerdict:
    if already_received:
        return SignalVerdict.DUPLICATE
    if execution.state not in (ExecutionState.RUNNING, ExecutionState.WAITING):
        return SignalVerdict.NOT_ACCEPTING
    if execution.state is ExecutionState.WAITING and execution.cursor == gate:
        return SignalVerdict.RESUME
    return SignalVerdict.STORE


class Wake(str, Enum):
    NOTHING = "nothing"
    RESUME = "resume"  # the signal is there after all: resume rather than fail
    TIME_OUT = "time_out"


def decide_wake(execution: ExecutionRecord, signal_received: bool, now: datetime) -> Wake:
    """The timer sweep found this run: its deadline re-checked, and the signal re-checked
    before failing it (guarantee 14)."""
    if execution.state is not ExecutionState.WAITING:
        return Wake.NOTHING
    if signal_received:
        return Wake.RESUME
    if execution.wake_at is None or execution.wake_at > now:
        return Wake.NOTHING
    return Wake.TIME_OUT
