"""Every step and reversal is a Celery task of its own, run as itself.

``register()`` binds each step of a definition to a task: a step given as a Celery task is
that task (looked up on the engine's app); a plain function becomes a task named
``<saga>.<step>`` (its reversal ``<saga>.<step>.compensate``), on ``saga_queue`` when set.
Each bound task's ``run`` is wrapped once: a message carrying the saga header goes through
admission, the claim and the store (see ``step_run``); any other call runs the body exactly
as before. ``retry`` is wrapped the same way, so ``self.retry()`` and ``autoretry_for`` ask
the saga for another attempt instead of sending a message of their own.

The wrapper must be in place before a worker builds the task's tracer (when its pool
starts): register sagas at import time of a module the worker imports, as tasks are. A
worker consuming in this process (the embedded worker, a thread or solo pool) is told
about steps registered after it started.
"""

from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery import Celery, bootsteps
from celery.signals import worker_init

from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import StepSpec, node_steps
from celery_saga.errors import DefinitionError, StepRetryRequested
from celery_saga.worker.saga_header import read_header

if TYPE_CHECKING:
    from celery.app.task import Task

#: Marks a wrapped task (the value is the body the wrapper calls).
_ORIGINAL_RUN = "__saga_original_run__"
#: Marks a task this module generated for a plain function (the value is the function).
GENERATED_FROM = "__saga_function__"

Runner = Callable[["Task", Callable[..., Any], dict[str, Any]], Any]


def is_celery_task(target: Any) -> bool:
    return hasattr(target, "apply_async") and isinstance(getattr(target, "name", None), str)


class StepTasks:
    """The Celery task of every registered step and reversal, by saga, step and kind."""

    def __init__(self, app: Celery, runner: Runner) -> None:
        self.app = app
        self.runner = runner
        self._names: dict[tuple[str, str, str], str] = {}
        self.consumers: weakref.WeakSet[Any] = weakref.WeakSet()
        app.steps["consumer"].add(_consumer_step(self.consumers))
        worker_init.connect(self._guard_every_task, weak=False)

    def bind(self, definition: SagaDefinition) -> None:
        """Find or make the task of each step and reversal of ``definition`` and wrap it;
        a combination a step cannot honour raises ``DefinitionError`` first."""
        bound: dict[tuple[str, str, str], Any] = {}
        for node in definition.nodes:
            for spec in node_steps(node):
                bound[(definition.name, spec.name, "do")] = self._task(definition, spec, "do")
                if spec.compensation is not None:
                    key = (definition.name, spec.name, "undo")
                    bound[key] = self._task(definition, spec, "undo")
        for key, task in bound.items():
            self._wrap(task)
            self._names[key] = task.name
        for consumer in list(self.consumers):
            consumer.update_strategies()  # knows the new tasks, traces the wrapped ones

    def task_for(self, saga_name: str, spec: StepSpec, kind: str = "do") -> Any:
        """The bound task of ``spec`` (``kind`` "do" or "undo"), or None if unbound."""
        name = self._names.get((saga_name, spec.name, kind))
        return None if name is None else self.app.tasks[name]

    # -- finding and making tasks ------------------------------------------------------
    def _task(self, definition: SagaDefinition, spec: StepSpec, kind: str) -> Any:
        target = spec.action if kind == "do" else spec.compensation
        what = f"step {spec.name!r} of saga {definition.name!r}"
        if kind == "undo":
            what = f"compensation of {what}"
        if is_celery_task(target):
            task = self.app.tasks.get(target.name)
            if task is None:
                raise DefinitionError(
                    f"{what}: task {target.name!r} is not registered on the Celery app "
                    f"{self.app.main!r} the engine is attached to; define it with that app's "
                    "@app.task or with @shared_task"
                )
            if kind == "do":
                _refuse_two_retry_policies(task, spec, what)
            return task
        suffix = "" if kind == "do" else ".compensate"
        return self._generated(f"{definition.name}.{spec.name}{suffix}", target, what)

    def _generated(self, name: str, function: Any, what: str) -> Any:
        existing = self.app.tasks.get(name)
        if existing is not None:
            if getattr(existing, GENERATED_FROM, None) is function:
                return existing
            raise DefinitionError(
                f"{what}: its task would be named {name!r}, but the app already has a task "
                "of that name; rename the step or the task"
            )
        queue = self.app.conf.get("saga_queue")
        options: dict[str, Any] = {"name": name, "shared": False, "lazy": False}
        if queue:
            options["queue"] = queue
        task = self.app.task(**options)(_as_task_body(function, name))
        setattr(task, GENERATED_FROM, function)
        return task

    # -- wrapping ----------------------------------------------------------------------
    def _guard_every_task(self, sender: Any = None, **_: Any) -> None:
        """At worker start (modules imported, pool not yet forked), wrap every task of the
        app, bound to a saga or not: a worker that imported a step's task but not its saga
        then refuses the message (the saga is unknown here) instead of running the body
        without admission. A message without the header runs as before."""
        if sender is None or sender.app is not self.app:
            return  # another app's worker: this app's tasks are left alone, not finalized
        for name, task in list(self.app.tasks.items()):
            if not name.startswith(("celery.", "celery_saga.")):
                self._wrap(task)

    def _wrap(self, task: Any) -> None:
        if _ORIGINAL_RUN in vars(task):
            return
        original = task.run
        runner = self.runner

        @functools.wraps(original)
        def run(*args: Any, **kwargs: Any) -> Any:
            header = read_header(task.request)
            if header is None:
                return original(*args, **kwargs)
            return runner(task, original, header)

        original_retry = task.retry

        @functools.wraps(original_retry)
        def retry(*args: Any, **kwargs: Any) -> Any:
            if read_header(task.request) is None:
                return original_retry(*args, **kwargs)
            raise _retry_request(task, *args, **kwargs)

        setattr(task, _ORIGINAL_RUN, original)
        task.run = run
        task.retry = retry


def _consumer_step(consumers: weakref.WeakSet[Any]) -> type:
    """A consumer bootstep that keeps the running consumers of this process in view."""

    class SagaStepTasks(bootsteps.StartStopStep):  # type: ignore[misc]
        requires = ("celery.worker.consumer.tasks:Tasks",)

        def start(self, consumer: Any) -> None:
            consumers.add(consumer)

        def stop(self, consumer: Any) -> None:
            consumers.discard(consumer)

    return SagaStepTasks


def _as_task_body(function: Any, task_name: str) -> Callable[..., Any]:
    """A plain function Celery can make a task of, whatever ``function`` is (a lambda, a
    partial, an object with ``__call__``); the step's arguments still follow ``function``'s
    own signature."""

    def body(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    body.__name__ = body.__qualname__ = "step_" + re.sub(r"\W", "_", task_name)
    body.__module__ = getattr(function, "__module__", None) or __name__
    body.__doc__ = getattr(function, "__doc__", None)
    return body


def _retry_request(
    task: Any,
    args: Any = None,
    kwargs: Any = None,
    exc: BaseException | None = None,
    throw: bool = True,
    eta: Any = None,
    countdown: float | None = None,
    max_retries: int | None = None,
    **options: Any,
) -> StepRetryRequested:
    """``self.retry(...)`` in a step: the attempt ends, and the saga decides about the next
    one with the countdown and limit Celery would have used."""
    if isinstance(exc, StepRetryRequested):  # ``self.retry()`` seen by ``autoretry_for``
        return exc
    if max_retries is None:
        max_retries = getattr(task, "override_max_retries", task.max_retries)
    if eta is not None:
        from celery.utils.time import maybe_make_aware

        countdown = max(0.0, (maybe_make_aware(eta) - task.app.now()).total_seconds())
    if countdown is None:
        countdown = float(task.default_retry_delay or 0)
    return StepRetryRequested(exc, float(countdown), max_retries)


def _refuse_two_retry_policies(task: Any, spec: StepSpec, what: str) -> None:
    """A task with ``autoretry_for`` brings its own retry policy; a step that sets ``retry=``
    too would have two, and which one wins would be a guess."""
    if getattr(task, "autoretry_for", ()) and spec.retry != 1:
        raise DefinitionError(
            f"{what}: task {task.name!r} retries itself (autoretry_for="
            f"{task.autoretry_for!r}, max_retries={task.max_retries}) and the step sets "
            f"retry={spec.retry}; keep one: drop the step's retry= to use the task's policy, "
            "or drop autoretry_for from the task"
        )
