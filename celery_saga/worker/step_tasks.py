"""Every step and reversal is a Celery task of its own, run as itself.

``register()`` binds each step of a definition to a task: a step given as a Celery task is
that task (looked up on the engine's app); a plain function becomes a task named
``<saga>.<step>`` (its reversal ``<saga>.<step>.compensate``), on ``saga_queue`` when set.
Every version of a saga shares that task: its message names the run's version (the header's
``v``), and the engine calls the body of that version's step, whichever version's function
the task was first made from. So a task name never depends on which versions a worker has,
and a worker that lacks the run's version hands the message back before any body runs.
Each bound task's ``run`` and ``retry`` are wrapped once, by ``celery_hooks`` (where every
change to Celery is made): a message carrying the saga header goes through admission, the
claim and the store (see ``step_run``); any other call runs the body exactly as before.

The wrapper must be in place before a worker builds the task's tracer (when its pool
starts): register sagas at import time of a module the worker imports, as tasks are. A
worker consuming in this process (the embedded worker, a thread or solo pool) is told
about steps registered after it started.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any, Protocol

from celery import Celery

from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import StepSpec, node_steps
from celery_saga.definition.validation import is_async_callable
from celery_saga.errors import DefinitionError
from celery_saga.runtime.async_bodies import run_coroutine
from celery_saga.runtime.invoke import running_body

#: Marks a task this module generated for a plain function (the value is the function).
GENERATED_FROM = "__saga_function__"
#: The (saga, step, kind) a generated task carries, for every version of the saga.
GENERATED_FOR = "__saga_step__"


def is_celery_task(target: Any) -> bool:
    return hasattr(target, "apply_async") and isinstance(getattr(target, "name", None), str)


class Wrapper(Protocol):
    """What binding a task needs of ``celery_hooks.CeleryHooks``."""

    def wrap(self, task: Any) -> None: ...

    def retrace(self) -> None: ...


class StepTasks:
    """The Celery task of every registered step and reversal, by saga, step and kind."""

    def __init__(self, app: Celery, hooks: Wrapper) -> None:
        self.app = app
        self.hooks = hooks
        self._names: dict[tuple[str, str, str], str] = {}

    def bind(self, definition: SagaDefinition) -> None:
        """Find or make the task of each step and reversal of ``definition`` and wrap it;
        a combination a step cannot honour raises ``DefinitionError`` first."""
        bound: dict[tuple[str, str, str], Any] = {}
        for node in definition.nodes:
            for spec in node_steps(node):
                key = (definition.name, spec.name, "forward")
                bound[key] = self._task(definition, spec, "forward")
                if spec.compensation is not None:
                    key = (definition.name, spec.name, "reversal")
                    bound[key] = self._task(definition, spec, "reversal")
        for key, task in bound.items():
            self.hooks.wrap(task)
            self._names[key] = task.name
        self.hooks.retrace()

    def task_for(self, saga_name: str, spec: StepSpec, kind: str = "forward") -> Any:
        """The bound task of ``spec`` (``kind`` "forward" or "reversal"), or None if unbound."""
        name = self._names.get((saga_name, spec.name, kind))
        return None if name is None else self.app.tasks[name]

    # -- finding and making tasks ------------------------------------------------------
    def _task(self, definition: SagaDefinition, spec: StepSpec, kind: str) -> Any:
        target = spec.action if kind == "forward" else spec.compensation
        what = f"step {spec.name!r} of saga {definition.name!r}"
        if kind == "reversal":
            what = f"compensation of {what}"
        if is_celery_task(target):
            task = self.app.tasks.get(target.name)
            if task is None:
                raise DefinitionError(
                    f"{what}: task {target.name!r} is not registered on the Celery app "
                    f"{self.app.main!r} the engine is attached to; define it with that app's "
                    "@app.task or with @shared_task"
                )
            _refuse_async_task(task, what)
            if kind == "forward":
                _refuse_two_retry_policies(task, spec, what)
            return task
        suffix = "" if kind == "forward" else ".compensate"
        carries = (definition.name, spec.name, kind)
        return self._generated(f"{definition.name}.{spec.name}{suffix}", target, what, carries)

    def _generated(self, name: str, function: Any, what: str, carries: tuple[str, ...]) -> Any:
        existing = self.app.tasks.get(name)
        if existing is not None:
            # Another version of the same step: the task carries both (see the docstring).
            if getattr(existing, GENERATED_FROM, None) is function:
                return existing
            if getattr(existing, GENERATED_FOR, None) == carries:
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
        setattr(task, GENERATED_FOR, carries)
        return task


def _as_task_body(function: Any, task_name: str) -> Callable[..., Any]:
    """A plain function Celery can make a task of, whatever ``function`` is (a lambda, a
    partial, an object with ``__call__``); the step's arguments still follow ``function``'s
    own signature."""

    def body(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    if is_async_callable(function):

        def body(*args: Any, **kwargs: Any) -> Any:
            value = function(*args, **kwargs)
            running = running_body.get()
            if running is not None and running.runs(function):
                return value  # awaited by the saga, within the step's timeout
            # A plain call of the task, outside any saga: its caller wants the value.
            return run_coroutine(lambda: value, None, f"task {task_name!r}")

    body.__name__ = body.__qualname__ = "step_" + re.sub(r"\W", "_", task_name)
    body.__module__ = getattr(function, "__module__", None) or __name__
    body.__doc__ = getattr(function, "__doc__", None)
    return body


def _refuse_async_task(task: Any, what: str) -> None:
    """Celery 5 calls a task's body and stores what it returns: an ``async def`` body would
    hand it an un-awaited coroutine, inside a saga or not."""
    if is_async_callable(inspect.unwrap(task.run)):
        raise DefinitionError(
            f"{what}: task {task.name!r} is an async def, and Celery cannot run a coroutine "
            "as a task's body; give the step the async function itself (the engine makes a "
            "task of it and awaits it on the worker's event loop), or make the task's body a "
            "plain def"
        )


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
