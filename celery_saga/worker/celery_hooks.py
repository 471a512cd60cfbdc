"""Every change the package makes to Celery, made by ``SagaEngine(app)`` for that app only.

Importing ``celery_saga`` changes nothing in Celery, and an app without an engine, in the
same process or not, keeps Celery's plain tasks, control commands and worker. For the app
it is given, ``CeleryHooks.install()``:

- wraps the ``run`` and ``retry`` of a step's task, on that task object: a message carrying
  the saga header goes to the engine's step runner (admission, claim, store); any other
  call runs the body as before. ``retry`` is wrapped the same way, so ``self.retry()`` and
  ``autoretry_for`` ask the saga for another attempt instead of sending a message;
- gives each of the app's tasks a request class of its own (``task.Request``, Celery's
  hook for it) that tells the engine, in the worker's main process, when the pool process
  running a message died, so its claims are given up at once;
- adds a worker bootstep (``app.steps["worker"]``): when a worker of the app starts, before
  its pool forks, every other task of the app is wrapped too, the saga event switch takes
  the worker's ``-E``, and the callbacks given to ``when_worker_starts`` run;
- adds a consumer bootstep (``app.steps["consumer"]``): it keeps the app's running consumers
  in view, so a step registered after a worker started is traced through its wrapper; wraps
  the handler the consumer makes for task messages (``Consumer.create_task_handler``), so a
  saga message the worker cannot run (a task or version it lacks, a run of another store) is
  held and handed back at the pace of its backoff before Celery looks at it
  (``hand_back``), and let go when the consumer stops; tells the workers consuming the same
  queues, as it starts, what it can run (``arrivals``); and
  gives that worker's remote-control mailbox a command table of its own in which
  ``enable_events`` / ``disable_events`` switch saga events too and the engine's own
  commands (``commands``: the claim holder's answer) are added. Celery's process-wide
  table, ``celery.worker.control.Panel.data``, is only read;
- connects ``worker_ready`` (Celery has no per-app signal for it), acting only for a worker
  of this app: one recovery sweep when a ``celery worker`` of the app is ready;
- connects ``task_postrun``, acting only for a saga message of this app that ended with an
  exception: once Celery has logged, signalled and stored it, its traceback is let go
  (``endings.let_traceback_go``), so a failed attempt's frames are freed at once;
- connects ``import_modules`` for this app once ``engine.autodiscover_sagas()`` asks: a
  worker, beat or ``celery shell`` of the app imports the sagas modules with its tasks;
- gives the app's settings a ``table`` of their own (``shown_settings``), so ``celery report``
  and ``celery inspect conf`` print neither a payload key nor the store's password.
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from billiard.exceptions import WorkerLostError
from celery import Celery, bootsteps
from celery.signals import import_modules, task_postrun, worker_ready
from celery.utils.imports import symbol_by_name
from celery.worker.consumer.control import Control

from celery_saga.errors import StepRetryRequested
from celery_saga.worker.endings import as_raised_by_user_code, let_traceback_go
from celery_saga.worker.event_hub import EventHub
from celery_saga.worker.publisher import RECOVER_TASK
from celery_saga.worker.saga_header import read_header
from celery_saga.worker.shown_settings import hide_secrets

if TYPE_CHECKING:
    from celery.app.task import Task

logger = logging.getLogger("celery_saga")

#: Marks a wrapped task (the value is the body the wrapper calls).
ORIGINAL_RUN = "__saga_original_run__"
#: The remote-control commands that switch saga events too, and the state each sets.
EVENT_SWITCH_COMMANDS = {"enable_events": True, "disable_events": False}

Runner = Callable[["Task", Callable[..., Any], dict[str, Any]], Any]


class CeleryHooks:
    """The saga engine's hold on one Celery app: see the module's docstring."""

    def __init__(self, app: Celery, runner: Runner, events: EventHub) -> None:
        self.app = app
        self.runner = runner
        self.events = events
        self.consumers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._at_worker_start: list[Callable[[], None]] = []
        self._at_task_end: list[Callable[[str], None]] = []
        #: Remote-control commands of the engine's own: name -> handler(state, **arguments).
        self.commands: dict[str, Callable[..., Any]] = {}
        #: Called with a worker's request whose pool process died running it.
        self.on_pool_loss: Callable[[Any], None] = lambda request: None
        #: The node name of the worker being built in this process, once one is.
        self.worker_name: str | None = None
        #: Wraps a consumer's task message handler: (consumer, handler) -> handler
        #: (see ``worker/hand_back.py``).
        self.task_handler: Callable[[Any, Any], Any] | None = None
        #: Called with a consumer that starts (again, after a lost connection), and stops.
        self.on_consumer_start: Callable[[Any], None] = lambda consumer: None
        self.on_consumer_stop: Callable[[Any], None] = lambda consumer: None

    def install(self) -> None:
        self.app.steps["worker"].add(_worker_step(self))
        self.app.steps["consumer"].add(_consumer_step(self))
        worker_ready.connect(self._request_sweep, weak=False)
        task_postrun.connect(self._task_ended, weak=False)
        hide_secrets(self.app)

    def _task_ended(
        self, sender: Any = None, retval: Any = None, task_id: Any = None, **_: Any
    ) -> None:
        if getattr(sender, "app", None) is not self.app:
            return
        if isinstance(retval, BaseException) and read_header(sender.request) is not None:
            let_traceback_go(retval)
        for callback in self._at_task_end:
            callback(task_id)

    def when_task_ends(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback(task_id)`` in the process that ran it, as each task of this app
        ends (the testing kit's explorer counts the messages handled); returns what stops
        the calls."""
        self._at_task_end.append(callback)
        return lambda: self._at_task_end.remove(callback)

    def when_worker_starts(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` in the main process of each worker of this app, as it starts."""
        self._at_worker_start.append(callback)

    def when_modules_imported(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` each time this app imports its task modules (a worker or beat
        starting), as ``app.autodiscover_tasks()`` does."""

        def receiver(**_: Any) -> None:
            callback()

        import_modules.connect(receiver, sender=self.app, weak=False)

    # -- tasks -------------------------------------------------------------------------
    def wrap(self, task: Any) -> None:
        """Wrap ``task``'s ``run`` and ``retry`` once (see the module's docstring)."""
        if ORIGINAL_RUN in vars(task):
            return
        original = task.run
        runner = self.runner

        @functools.wraps(original)
        def run(*args: Any, **kwargs: Any) -> Any:
            header = read_header(task.request)
            if header is None:
                return original(*args, **kwargs)
            try:
                return runner(task, original, header)
            except Exception as error:  # the engine's frames out of the user's traceback
                raise as_raised_by_user_code(error)  # noqa: B904 - the same exception

        original_retry = task.retry

        @functools.wraps(original_retry)
        def retry(*args: Any, **kwargs: Any) -> Any:
            if read_header(task.request) is None:
                return original_retry(*args, **kwargs)
            raise _retry_request(task, *args, **kwargs)

        setattr(task, ORIGINAL_RUN, original)
        task.run = run
        task.retry = retry
        self.follow_pool_losses(task)

    def follow_pool_losses(self, task: Any) -> None:
        """Give ``task`` a request class that reports a pool process lost under it."""
        base = symbol_by_name(task.Request)
        if not getattr(base, "_saga_follows_losses", False):
            task.Request = _losing_request(base, lambda request: self.on_pool_loss(request))

    def retrace(self) -> None:
        """Tell the consumers running in this process about newly bound tasks."""
        for consumer in list(self.consumers):
            consumer.update_strategies()  # knows the new tasks, traces the wrapped ones

    # -- worker start ------------------------------------------------------------------
    def worker_starting(self, worker: Any) -> None:
        """A worker of this app is being built (modules imported, pool not yet forked)."""
        # Every task, bound to a saga or not: a worker that imported a step's task but not
        # its saga then refuses the message (the saga is unknown here) instead of running
        # the body without admission. A message without the header runs as before.
        for name, task in list(self.app.tasks.items()):
            if name.startswith("celery_saga."):
                self.follow_pool_losses(task)
            elif not name.startswith("celery."):
                self.wrap(task)
        self.events.switch(bool(getattr(worker, "task_events", self.events.send_to_celery)))
        self.worker_name = str(getattr(worker, "hostname", "") or "") or None
        for callback in self._at_worker_start:
            callback()

    def _request_sweep(self, sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is self.app:  # not a worker of another app
            self._send_sweep()

    def _send_sweep(self) -> None:
        self.app.send_task(RECOVER_TASK, queue=self.app.conf.get("saga_queue") or None)

    # -- remote control ----------------------------------------------------------------
    def own_command_table(self, consumer: Any) -> None:
        """Give ``consumer``'s mailbox a copy of its command table with the event switch
        commands wrapped. Celery builds the mailbox node when the Control bootstep is
        built (for the gevent/eventlet mailbox too), before any message can arrive."""
        for step in consumer.blueprint.steps.values():
            if isinstance(step, Control):
                node = step.box.node
                table = dict(node.handlers)
                for name, on in EVENT_SWITCH_COMMANDS.items():
                    if name in table:
                        table[name] = _following_saga_events(table[name], self.events, on)
                table.update(self.commands)
                node.handlers = table


def _following_saga_events(command: Any, events: EventHub, on: bool) -> Any:
    """``command``, then the saga event switch set to ``on``: the control command reaches
    only the worker's main process, the switch is shared with its pool's processes."""

    @functools.wraps(command)
    def switched(state: Any, *args: Any, **kwargs: Any) -> Any:
        reply = command(state, *args, **kwargs)
        if events.send_to_celery != on:  # Flower repeats enable_events every few seconds
            events.switch(on)
            logger.info("saga events %s by remote", "enabled" if on else "disabled")
        return reply

    return switched


def _losing_request(base: type, on_loss: Callable[[Any], None]) -> type:
    class SagaRequest(base):  # type: ignore[misc]
        """Celery's request, telling the engine when its pool process died."""

        _saga_follows_losses = True

        def on_failure(self, exc_info: Any, *args: Any, **kwargs: Any) -> Any:
            error = getattr(exc_info, "exception", None)
            error = getattr(error, "exc", error)  # unwrapped from ExceptionWithTraceback
            if isinstance(error, WorkerLostError):
                on_loss(self)
            return super().on_failure(exc_info, *args, **kwargs)

    return SagaRequest


def _worker_step(hooks: CeleryHooks) -> type:
    class SagaWorker(bootsteps.Step):  # type: ignore[misc]
        """Readies the app's tasks and saga events as a worker of the app is built."""

        def __init__(self, worker: Any, **kwargs: Any) -> None:
            super().__init__(worker, **kwargs)
            hooks.worker_starting(worker)

    return SagaWorker


def _consumer_step(hooks: CeleryHooks) -> type:
    class SagaConsumer(bootsteps.StartStopStep):  # type: ignore[misc]
        """The app's own control commands; the running consumer kept in view."""

        requires = (
            "celery.worker.consumer.tasks:Tasks",
            "celery.worker.consumer.control:Control",
        )

        def __init__(self, consumer: Any, **kwargs: Any) -> None:
            super().__init__(consumer, **kwargs)
            hooks.own_command_table(consumer)
            if hooks.task_handler is not None:  # made again each time its loop starts
                consumer.create_task_handler = _wrapped_handler(
                    consumer, consumer.create_task_handler, hooks.task_handler
                )

        def start(self, consumer: Any) -> None:
            hooks.consumers.add(consumer)
            hooks.on_consumer_start(consumer)

        def stop(self, consumer: Any) -> None:
            hooks.consumers.discard(consumer)
            hooks.on_consumer_stop(consumer)

        def shutdown(self, consumer: Any) -> None:
            self.stop(consumer)

    return SagaConsumer


def _wrapped_handler(
    consumer: Any, create: Callable[..., Any], wrap: Callable[[Any, Any], Any]
) -> Callable[..., Any]:
    @functools.wraps(create)
    def create_task_handler(*args: Any, **kwargs: Any) -> Any:
        return wrap(consumer, create(*args, **kwargs))

    return create_task_handler


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
