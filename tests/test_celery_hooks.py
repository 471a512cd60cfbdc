"""Celery is changed in one place, for one app: ``SagaEngine(app)`` wraps that app's tasks and
control commands, and a second Celery app in the same process keeps Celery's plain ones.
Importing the package changes nothing in Celery."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.app.task import Task
from celery.worker import control
from celery.worker.consumer.control import Control

from celery_saga import Saga, SagaEngine
from celery_saga.worker.embedded import embedded_worker

ROOT = Path(__file__).resolve().parent.parent


def _memory_app(prefix: str) -> Celery:
    # Its own queue: every app in the process shares the in-memory transport.
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    app = Celery(name, broker="memory://localhost/", set_as_current=False)
    app.conf.update(
        task_default_queue=name,
        result_backend="cache+memory://",
        broker_transport_options={"polling_interval": 0.01},
        worker_hijack_root_logger=False,
    )
    return app


def _command_table(worker: Any) -> dict[str, Any]:
    """The command table the running worker's mailbox answers from."""
    (box,) = [s.box for s in worker.consumer.blueprint.steps.values() if isinstance(s, Control)]
    return box.node.handlers  # type: ignore[no-any-return]


def _is_plain(task: Any) -> bool:
    """``task`` runs and retries as Celery made it: nothing set on the task object."""
    return (
        "run" not in vars(task)
        and "retry" not in vars(task)
        and type(task).retry is Task.retry
        and task.run is type(task).run
    )


@pytest.fixture
def two_apps(tmp_path: Path) -> Iterator[tuple[SagaEngine, Celery, dict[str, Any]]]:
    """A saga app (engine, a step task, a task no saga uses) and a plain app with a task,
    each with an embedded worker running in this process."""
    saga_app, plain_app = _memory_app("hooked"), _memory_app("plain")
    engine = SagaEngine(saga_app, store_url=f"sqlite:///{tmp_path}/store.sqlite3")
    engine.ensure_schema()

    @saga_app.task(name="hooked.reserve", shared=False)
    def reserve() -> str:
        return "reserved"

    @saga_app.task(name="hooked.audit", shared=False)
    def audit() -> str:  # no saga uses it
        return "audited"

    @plain_app.task(name="plain.reserve", shared=False)
    def plain_reserve() -> str:
        return "reserved"

    engine.register(Saga("hooked").step(reserve))
    tasks: dict[str, Any] = {
        "reserve": saga_app.tasks["hooked.reserve"],
        "audit": saga_app.tasks["hooked.audit"],
        "plain": plain_app.tasks["plain.reserve"],
    }
    with ExitStack() as stack:
        for app in (saga_app, plain_app):
            options = {"hostname": f"{app.main}@localhost"}
            tasks[app.main] = stack.enter_context(embedded_worker(app, concurrency=1, **options))
        yield engine, plain_app, tasks
    engine.db.dispose()


def test_a_second_app_keeps_plain_run_retry_and_control_commands(
    two_apps: tuple[SagaEngine, Celery, dict[str, Any]],
) -> None:
    engine, plain_app, tasks = two_apps
    saga_worker, plain_worker = tasks[engine.app.main], tasks[plain_app.main]
    assert not _is_plain(tasks["reserve"]) and not _is_plain(tasks["audit"]), (
        "the engine's app: its step and, once its worker started, its other tasks are wrapped"
    )
    assert _is_plain(tasks["plain"]), "the other app's task keeps Celery's run and retry"
    assert plain_app.send_task("plain.reserve").get(timeout=10) == "reserved"

    plain_table = _command_table(plain_worker)
    assert plain_table is control.Panel.data
    assert plain_table["enable_events"] is control.enable_events
    assert plain_table["disable_events"] is control.disable_events

    saga_table = _command_table(saga_worker)
    assert saga_table is not control.Panel.data
    assert saga_table["enable_events"].__wrapped__ is control.enable_events
    assert saga_table["disable_events"].__wrapped__ is control.disable_events
    own = {n for n in saga_table if n not in control.Panel.data}
    assert own == {
        "saga_claim_holder",
        "saga_runs_running",
        "saga_hand_backs",
        "saga_worker_arrived",
    }, "the engine adds its claim holders' answers and its hand-backs' commands, only"
    assert "saga_claim_holder" not in plain_table
    assert {n: f for n, f in saga_table.items() if not n.endswith("_events") and n not in own} == {
        n: f for n, f in control.Panel.data.items() if not n.endswith("_events")
    }, "every other command is Celery's own"


def test_the_engines_worker_switches_saga_events_by_remote_control(
    two_apps: tuple[SagaEngine, Celery, dict[str, Any]],
) -> None:
    engine, plain_app, _ = two_apps
    saga_host, plain_host = f"{engine.app.main}@localhost", f"{plain_app.main}@localhost"
    assert not engine.events.send_to_celery
    replies = engine.app.control.enable_events(destination=[saga_host], reply=True, timeout=5)
    assert [list(r) for r in replies] == [[saga_host]]
    assert engine.events.send_to_celery
    engine.app.control.disable_events(destination=[saga_host], reply=True, timeout=5)
    assert not engine.events.send_to_celery
    replies = plain_app.control.enable_events(destination=[plain_host], reply=True, timeout=5)
    assert [list(r) for r in replies] == [[plain_host]], "the plain worker answers as Celery's"


def test_importing_the_package_and_attaching_an_engine_leave_celery_alone(
    tmp_path: Path,
) -> None:
    script = f"""
        from celery import Celery
        from celery.worker import control

        before = dict(control.Panel.data)
        import celery_saga, celery_saga.testing, celery_saga.worker.engine, celery_saga.cli
        assert control.Panel.data == before, "importing changed Celery's control commands"
        app = Celery("hooked", broker="memory://", set_as_current=False)
        engine = celery_saga.SagaEngine(app, store_url="sqlite:///{tmp_path}/store.sqlite3")
        engine.register(celery_saga.Saga("s").step("only", lambda ctx: 1))
        assert control.Panel.data == before, "an engine changed Celery's control commands"
        assert control.Panel.data["enable_events"] is control.enable_events
    """
    code = textwrap.dedent(script)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
