"""A bulk retry of held runs (issue 42's drill), on PostgreSQL with real prefork workers:
its CLI killed mid-way (SIGKILL) and run again with ``--resume``: every run retried once
under the operation, its step run once more and its charge made once."""

from __future__ import annotations

import uuid
from collections import Counter

from celery_saga import ExecutionState
from celery_saga.store.history import Kind
from tests.conftest import Harness
from tests.test_bulk_moves import (
    ON_POSTGRES,
    _in_state,
    _killed_and_resumed,
    _states,
    _until,
    moved_rows,
)


def _held_batch(harness: Harness, batch: str, count: int) -> tuple[list[str], str]:
    """``count`` runs of ``held_order`` held at ``charge`` (its provider down), labelled."""
    switch = f"down-{uuid.uuid4().hex}"
    harness.test_app.set_switch(switch, True)
    engine = harness.engine
    runs = [
        engine.start("held_order", {"order": n, "down": switch}, labels={"batch": batch}).id
        for n in range(count)
    ]
    _until(
        lambda: _in_state(engine, runs, ExecutionState.HELD) == count,
        what=f"{count} runs held",
    )
    return runs, switch


@ON_POSTGRES
def test_a_bulk_retry_killed_mid_way_and_resumed_retries_every_held_run_once(
    harness: Harness,
) -> None:
    engine, batch = harness.engine, uuid.uuid4().hex[:10]
    runs, switch = _held_batch(harness, batch, 240)
    harness.test_app.set_switch(switch, False)  # the provider is back
    where = ["--where", f"label.batch={batch}"]
    # The states a retry leaves too: the runs it moved stay selected, and only the
    # operation's own history rows keep it from retrying them again.
    for state in ("held", "running", "completed"):
        where += ["--where", f"state={state}"]
    mark = _killed_and_resumed(
        harness, "retry", where, lambda: moved_rows(engine, runs, Kind.HOLD_RETRIED)
    )
    rows = moved_rows(engine, runs, Kind.HOLD_RETRIED)
    assert all(len(actors) == 1 and actors[0].endswith(mark) for actors in rows.values())
    # A retry whose message the killed process never sent is left to the recovery sweep.
    engine.recover(0)
    _until(
        lambda: _in_state(engine, runs, ExecutionState.COMPLETED) == len(runs),
        what=str(_states(engine, runs)),
    )
    ledger = [e for run in runs for e in harness.test_app.entries(run) if e.step == "charge"]
    effects = Counter(e.execution_id for e in ledger if e.direction == "effect")
    assert effects == dict.fromkeys(runs, 1), "one charge per run"
    attempts = Counter(e.execution_id for e in ledger if e.direction == "forward")
    assert attempts == dict.fromkeys(runs, 3), "2 held attempts, then 1 retried: no step twice"
