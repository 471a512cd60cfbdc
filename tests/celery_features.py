"""Tasks that use Celery's own features, as steps of the test app's sagas.

Each records what Celery told it (its request, its hooks, the signals sent for it) in the
ledger, from whichever worker process ran it, so a test can compare a step with a plain
call of the same task.
"""

from __future__ import annotations

import time
from typing import Any

from celery import Task, signals

from celery_saga import Saga
from celery_saga.worker.saga_header import read_header

#: The test app (by its Celery app) whose ledger a task's hooks and signals write to.
_apps: dict[int, Any] = {}


def _record(task: Any, direction: str, detail: str = "", task_id: str | None = None) -> None:
    test_app = _apps.get(id(task._get_app()))
    if test_app is None:
        return
    request = task.request
    header = read_header(request) or {}
    with test_app.sql.begin() as connection:
        from tests.sagaapp import ledger

        connection.execute(
            ledger.insert().values(
                execution_id=header.get("id") or request.kwargs.get("marker", "plain"),
                step=task.name,
                direction=direction,
                key=task_id or request.id,
                forward_key=None,
                detail=detail,
            )
        )


class Recorded(Task):  # type: ignore[misc]
    """A base class like the ones that open a session or set a tenant per task."""

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        _record(self, "before_start", task_id=task_id)

    def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
        _record(self, "on_success", f"{retval!r} {sorted(kwargs)!r}", task_id)

    def on_failure(self, exc: Any, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        _record(self, "on_failure", repr(exc), task_id)

    def on_retry(self, exc: Any, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        _record(self, "on_retry", repr(exc), task_id)

    def after_return(self, status: str, *rest: Any) -> None:
        _record(self, "after_return", status)


def _watch_signals() -> None:
    def note(name: str) -> Any:
        def handler(sender: Any = None, **fields: Any) -> None:
            task = fields.get("task") or sender
            if not isinstance(task, Task) or not task.name.startswith(("features.", "feat_")):
                return
            request = fields.get("request")  # task_retry: the request of the attempt
            detail = (
                repr(request.id)
                if request is not None
                else repr(sorted(fields.get("kwargs") or {}))
            )
            _record(task, f"signal:{name}", detail, fields.get("task_id"))

        return handler

    for name in ("task_prerun", "task_postrun", "task_success", "task_failure", "task_retry"):
        getattr(signals, name).connect(note(name), weak=False)


def define(test_app: Any) -> None:
    app = test_app.app
    _apps[id(app)] = test_app

    @app.task(name="features.hooked", base=Recorded, bind=True, shared=False)
    def hooked(
        self: Any, order: int, plan: dict[str, Any] | None = None, marker: str | None = None
    ) -> dict[str, Any]:
        attempt = self.request.retries + 1
        info = self.request.delivery_info or {}
        detail = (
            f"attempt={attempt} called_directly={self.request.called_directly} "
            f"queue={info.get('routing_key')}"
        )
        _record(self, "forward", detail)
        if ((plan or {}).get("hooked") or {}).get("fail_attempts", 0) >= attempt:
            raise ValueError(f"card declined for order {order}")
        return {"charged": order}

    @app.task(name="features.undo_hooked", base=Recorded, shared=False)
    def undo_hooked(result: Any) -> None:
        _record(undo_hooked, "compensate", repr(result))

    @app.task(name="features.boom", base=Recorded, shared=False)
    def boom(order: int) -> None:
        raise ValueError(f"warehouse refused order {order}")

    @app.task(name="features.limited", rate_limit="1/s", shared=False)
    def limited() -> None:
        _record(limited, "forward", repr(time.time()))

    @app.task(name="features.urgent", priority=7, bind=True, shared=False)
    def urgent(self: Any) -> None:
        _record(self, "forward", repr((self.request.delivery_info or {}).get("priority")))

    @app.task(name="features.retrying", bind=True, shared=False)
    def retrying(self: Any, failures: int = 2) -> int:
        _record(self, "forward", f"retries={self.request.retries}")
        if self.request.retries < failures:
            raise self.retry(countdown=0.2, max_retries=3, exc=ConnectionError("busy"))
        return int(self.request.retries)

    @app.task(
        name="features.flaky",
        autoretry_for=(ConnectionError,),
        max_retries=2,
        default_retry_delay=0.1,
        bind=True,
        shared=False,
    )
    def flaky(self: Any, failures: int = 2) -> str:
        _record(self, "forward", f"retries={self.request.retries}")
        if self.request.retries < failures:
            raise ConnectionError("upstream reset the connection")
        return "fetched"

    test_app.feature_tasks = {
        task.name: task for task in (hooked, undo_hooked, boom, limited, urgent, retrying, flaky)
    }
    test_app.engine.register(
        Saga("feat_hooks").step(hooked, compensate=undo_hooked, retry=2, backoff=0.05).step(boom),
        Saga("feat_result").step(hooked),
        Saga("feat_rate").step(limited),
        Saga("feat_priority").step(urgent),
        Saga("feat_retry").step(retrying),
        Saga("feat_autoretry").step(flaky).step("after", step_after),
        Saga("feat_plain").step("note", note_plain, compensate=undo_plain).step(boom),
        Saga("feat_map").map("total", lambda ctx: sum(ctx.input["amounts"])),
    )


def step_after() -> str:
    return "after"


def note_plain(order: int) -> dict[str, int]:
    return {"noted": order}


def undo_plain(result: Any) -> None:
    return None


_watch_signals()
