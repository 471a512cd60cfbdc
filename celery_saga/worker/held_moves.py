"""The operator's moves on a held run (``engine.retry``, ``engine.skip``,
``engine.unwind``), each with its handed-on side, as ``run_commands``' are: a process
without the run's version checks what it can (the run exists and is held; an unwind, that
it is short of its pivot), then hands the move on to a worker that has the version.

Each move is a compare-and-set on the held run (``store/holds.py``): against another
operator, a cancel, a deadline or the hold timeout, the first one lands; any other is
refused with ``InvalidStateError`` naming the run's state, and stores nothing.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from celery_saga.errors import InvalidStateError, VersionNotDeployedError
from celery_saga.records import ExecutionRecord
from celery_saga.store import holds
from celery_saga.store.codec import pack, unpack
from celery_saga.worker.arguments import check_actor, check_reason
from celery_saga.worker.parts import WorkerParts
from celery_saga.worker.run_lookup import definition_of, pivot_name, run_of


def _held(parts: WorkerParts, execution_id: str, move: str) -> ExecutionRecord:
    return parts.store.run(
        f"reading the hold of {execution_id!r}",
        lambda: holds.read_held(parts.db, execution_id, move).execution,
    )


def _checked(actor: str | None, reason: str | None, move: str) -> None:
    check_actor(actor)
    check_reason(reason, f"a {move} reason")


def retry_run(parts: WorkerParts, execution_id: str, actor: str | None, reason: str | None) -> None:
    """``engine.retry``: here, or handed on when this process lacks the run's version."""
    _checked(actor, reason, "retry")
    try:
        definition, record = run_of(parts, execution_id)
    except VersionNotDeployedError as missing:
        _held(parts, execution_id, "retry")
        parts.publisher.hand_on(missing, execution_id, "retry", actor=actor, reason=reason)
        return
    with parts.tracer.action("retry", execution_id, actor, record.trace_context):
        parts.store.run(
            f"retrying the held step of {execution_id!r}",
            lambda: parts.executor.move_held(
                lambda held: held.retry(definition, execution_id, actor, reason)
            ),
        )


def skip_run(
    parts: WorkerParts, execution_id: str, result: Any, actor: str | None, reason: str | None
) -> None:
    """``engine.skip``: here (the result checked against the step's ``output_schema``),
    or handed on when this process lacks the run's version (the worker checks it then)."""
    _checked(actor, reason, "skip")
    try:
        definition, record = run_of(parts, execution_id)
    except VersionNotDeployedError as missing:
        _held(parts, execution_id, "skip")
        blob = pack(
            result,
            what=f"the result given to skip the held step of {execution_id!r}",
            limit=parts.settings.max_payload_bytes,
        )
        encoded = base64.b64encode(blob).decode("ascii")
        fields = {"result": encoded, "actor": actor, "reason": reason}
        parts.publisher.hand_on(missing, execution_id, "skip", **fields)
        return
    with parts.tracer.action("skip", execution_id, actor, record.trace_context):
        parts.store.run(
            f"skipping the held step of {execution_id!r}",
            lambda: parts.executor.move_held(
                lambda held: held.skip(definition, execution_id, result, actor, reason)
            ),
        )


def unwind_run(
    parts: WorkerParts, execution_id: str, actor: str | None, reason: str | None
) -> None:
    """``engine.unwind``: refused past the pivot, naming it; else here, or handed on."""
    _checked(actor, reason, "unwind")
    try:
        definition = definition_of(parts, execution_id)
    except VersionNotDeployedError as missing:
        run = _held(parts, execution_id, "unwind")
        if run.committed_at is not None:
            _refuse_past_pivot(run, "its version is not here to name it")
        parts.publisher.hand_on(missing, execution_id, "unwind", actor=actor, reason=reason)
        return
    run = _held(parts, execution_id, "unwind")
    if run.committed_at is not None:
        _refuse_past_pivot(run, pivot_name(definition))
    with parts.tracer.action("unwind", execution_id, actor, run.trace_context):
        parts.store.run(
            f"unwinding the held run {execution_id!r}",
            lambda: parts.executor.move_held(
                lambda held: held.unwind(definition, execution_id, actor, reason)
            ),
        )


def _refuse_past_pivot(run: ExecutionRecord, pivot: str) -> None:
    raise InvalidStateError(
        f"execution {run.id!r} of saga {run.saga_name!r} has passed its pivot ({pivot}), the "
        "point of no return: it cannot be unwound; retry or skip its held step"
    )


def _retry_handed_on(parts: WorkerParts, execution_id: str, arguments: dict[str, Any]) -> None:
    retry_run(parts, execution_id, arguments.get("actor"), arguments.get("reason"))


def _skip_handed_on(parts: WorkerParts, execution_id: str, arguments: dict[str, Any]) -> None:
    result = unpack(base64.b64decode(arguments["result"]))
    skip_run(parts, execution_id, result, arguments.get("actor"), arguments.get("reason"))


def _unwind_handed_on(parts: WorkerParts, execution_id: str, arguments: dict[str, Any]) -> None:
    unwind_run(parts, execution_id, arguments.get("actor"), arguments.get("reason"))


#: A worker's side of each move a process without the run's version hands on.
HANDED_ON: dict[str, Callable[[WorkerParts, str, dict[str, Any]], None]] = {
    "retry": _retry_handed_on,
    "skip": _skip_handed_on,
    "unwind": _unwind_handed_on,
}
