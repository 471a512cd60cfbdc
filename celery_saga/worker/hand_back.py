"""A worker that lacks a run's version hands the run's message back (guarantee 22).

The run is never failed for it and the message is never dropped: the same message (same
task, id, arguments and routing) is sent again with a countdown that grows with the count
kept in the saga header (``handed``), for whichever worker takes it next; a worker with the
run's version runs it. One log line per hand-back, and the run is marked as waiting for its
version (``get``, ``celery saga show``/``list``/``versions`` show it) until it moves again.

Two ways in: the task is registered here but the run's version is not (the runtime raises
``VersionNotDeployedError`` before claiming anything), or the message names a task this
worker does not have at all (a step only the newer version has): Celery's consumer then
calls ``on_unknown_task``, which would drop the message; for a saga message it hands it back.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import SQLAlchemyError

from celery_saga.decisions.versions import hand_back_countdown
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.identity import process_name
from celery_saga.runtime.outcomes import NoBody
from celery_saga.store import versions
from celery_saga.worker.saga_header import HANDED, HEADER, VERSION, read_header

if TYPE_CHECKING:
    from celery_saga.worker.engine import SagaEngine

logger = logging.getLogger("celery_saga")


def hand_back_running(engine: SagaEngine, task: Any, saga: str, version: str) -> NoBody:
    """The message now running in ``task`` is of a run on ``version``, not registered here."""
    request = task.request
    header = dict(read_header(request) or {})
    header.setdefault(VERSION, version)
    args = list(request.args or ())
    execution_id = str(header.get("id") or (args[0] if args else ""))
    header.setdefault("id", execution_id)
    header.setdefault("saga", saga)
    hand_back(
        engine,
        task.name,
        header,
        args=args,
        kwargs={},  # a saga message's arguments are all in ``args`` and the header
        task_id=request.id,
        retries=request.retries or 0,
        timelimit=request.timelimit,
        delivery_info=request.delivery_info or {},
    )
    return NoBody(f"handed back: version {version} of saga {saga!r} is not registered here")


def hand_back(
    engine: SagaEngine,
    task_name: str,
    header: dict[str, Any],
    *,
    args: Any,
    kwargs: Any,
    task_id: str | None,
    retries: int,
    timelimit: Any,
    delivery_info: Mapping[str, Any],
) -> None:
    """Send the message again (see the module's docstring), mark the run, log one line."""
    times = int(header.get(HANDED, 0))
    countdown = hand_back_countdown(times)
    execution_id, version = str(header.get("id", "")), str(header.get(VERSION, "unknown"))
    _mark(engine, execution_id, version)
    hard, soft = timelimit or (None, None)
    options: dict[str, Any] = {"time_limit": hard, "soft_time_limit": soft} if hard or soft else {}
    for key in ("exchange", "routing_key"):
        if delivery_info.get(key) is not None:
            options[key] = delivery_info[key]
    engine.publisher.send(
        execution_id,
        task_name,
        args=args,
        kwargs=kwargs,
        headers={HEADER: {**header, HANDED: times + 1}},
        task_id=task_id,
        retries=retries,
        countdown=countdown,
        expires=None,
        **options,
    )
    logger.warning(
        "execution %s: version %s of saga %r is not registered on this worker; message %s "
        "handed back (%d) for a worker that has it, offered again in %.1f s",
        execution_id,
        version,
        header.get("saga"),
        task_name,
        times + 1,
        countdown,
    )


def _mark(engine: SagaEngine, execution_id: str, version: str) -> None:
    """Best effort: the hand-back itself must not wait for the store."""
    try:
        versions.mark_waiting(
            engine.db,
            execution_id=execution_id,
            definition_hash=version,
            handed_back_by=process_name(),
            now=get_clock().now(),
        )
    except SQLAlchemyError as error:
        logger.info("execution %s: not marked as waiting for its version (%s)", execution_id, error)


def on_unknown_task(engine: SagaEngine, original: Any) -> Any:
    """Wrap a consumer's ``on_unknown_task``: a saga message for a task this worker lacks is
    handed back and acknowledged; any other unknown task goes to Celery's own handler."""

    def handler(body: Any, message: Any, exc: Any) -> Any:
        headers = getattr(message, "headers", None) or {}
        header = headers.get(HEADER)
        if not isinstance(header, dict) or "id" not in header:
            return original(body, message, exc)
        try:
            args, kwargs, _embed = message.decode()
            hand_back(
                engine,
                str(headers.get("task")),
                dict(header),
                args=args,
                kwargs=kwargs,
                task_id=headers.get("id"),
                retries=int(headers.get("retries") or 0),
                timelimit=headers.get("timelimit"),
                delivery_info=message.delivery_info or {},
            )
        except Exception:
            what = headers.get("task")
            logger.exception("a saga message for unknown task %r could not be handed back", what)
            return original(body, message, exc)
        message.ack()
        return None

    return handler
