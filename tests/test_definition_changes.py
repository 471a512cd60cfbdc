"""Guarantees 8 and 22: a run finishes on its own version; a vanished reversal halts the
unwind."""

from __future__ import annotations

import threading
from dataclasses import replace

from celery_saga import ExecutionState, RollbackStatus, Saga
from celery_saga.definition.builder import SagaDefinition
from tests.conftest import Harness


def _redeploy_during(harness: Harness, step: str, replacement: Saga) -> threading.Event:
    """Swap the deployed definition while ``step`` of the next run is executing."""
    swapped = threading.Event()

    def on_start(_event: str, fields: dict[str, object]) -> None:
        if fields.get("step") == step and not swapped.is_set():
            harness.engine.catalog.add(replacement.seal())
            swapped.set()

    harness.engine.on("saga-step-started", on_start)
    return swapped


def _swap_version_during(harness: Harness, step: str, swapped: SagaDefinition) -> None:
    def on_start(_event: str, fields: dict[str, object]) -> None:
        if fields.get("step") == step:
            harness.engine.catalog._versions[swapped.name][swapped.hash] = swapped

    harness.engine.on("saga-step-started", on_start)


def test_a_run_finishes_on_its_own_version_when_a_new_one_is_registered(
    sqlite_harness: Harness,
) -> None:
    app = sqlite_harness.test_app
    fwd, rev = app.forward, app.reverse
    sqlite_harness.engine.register(Saga("evolving").step("a", fwd, compensate=rev).step("b", fwd))
    changed = Saga("evolving").step("a", fwd, compensate=rev).step("new", fwd).step("b", fwd)
    swapped = _redeploy_during(sqlite_harness, "a", changed)
    run = sqlite_harness.start("evolving", {"plan": {"a": {"sleep": 0.3}}})
    execution = run.wait(30)
    assert swapped.is_set()
    assert execution.state is ExecutionState.COMPLETED, execution.failure_reason
    assert [r.name for r in execution.steps] == ["a", "b"], "nothing ran against the new graph"
    newer = sqlite_harness.start("evolving").wait(30)
    assert [r.name for r in newer.steps] == ["a", "new", "b"], "new runs start on the newest"
    assert newer.record.definition_hash == changed.seal().hash


def test_a_reversal_whose_definition_vanished_halts_the_unwind(sqlite_harness: Harness) -> None:
    app = sqlite_harness.test_app
    fwd, rev = app.forward, app.reverse
    sqlite_harness.engine.register(
        Saga("renaming").step("a", fwd, compensate=rev).step("b", fwd, compensate=rev)
    )
    original = sqlite_harness.engine.definition("renaming")
    renamed = Saga("renaming").step("a_renamed", fwd, compensate=rev).step("b", fwd, compensate=rev)
    # A run only ever meets its own version, so a vanished compensation can no longer come
    # from a redeploy; the halt still stands: the run's version is swapped under its hash.
    _swap_version_during(sqlite_harness, "b", replace(renamed.seal(), hash=original.hash))
    run = sqlite_harness.start("renaming", {"plan": {"b": {"sleep": 0.3, "fail": True}}})
    execution = run.wait(30)
    assert execution.state is ExecutionState.COMPENSATION_STUCK
    assert execution.rollback_status is RollbackStatus.STUCK
    assert "'a' owed a reversal" in (execution.record.rollback_reason or "")
    undone = [e.step for e in app.entries(run.id) if e.direction == "compensate"]
    assert undone == ["b"], "the vanished step is neither reversed nor silently dropped"
