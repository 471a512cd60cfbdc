"""The operator's pause of a step or a whole saga (``engine.pause``, ``engine.unpause``,
``engine.pauses``).

``pause`` stores one row (``store/pauses.py``): from then on the step claim's own statement
refuses the step, and a worker that meets the refusal holds the run at the step's door
(``runtime/pauses.py``). ``unpause`` deletes the row, then releases the runs that pause
held, earliest first, at most ``rate`` a second: each release is one conditional write
and the step's message, sent here or, in a process without the run's version, handed on
to a worker that has it (``HANDED_ON``). Interrupted and run again, it releases what is
left and never a run twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery_saga.definition.nodes import ParallelNode
from celery_saga.errors import SagaError, UnknownSagaError, VersionNotDeployedError
from celery_saga.records import Pause
from celery_saga.runtime.clock import get_clock
from celery_saga.store import pauses
from celery_saga.worker.arguments import check_actor, check_reason
from celery_saga.worker.parts import WorkerParts
from celery_saga.worker.run_lookup import run_of

logger = logging.getLogger("celery_saga")

#: How many held runs one read of an unpause's release takes.
PAGE = 500


@dataclass(frozen=True)
class Unpaused:
    """What an unpause did: the pause it lifted (None: none was stored, a run again) and
    how many held runs it released."""

    pause: Pause | None
    released: int


def _check_names(parts: WorkerParts, saga: str, step: str | None) -> None:
    """The saga is registered here, and ``step`` (when named) is one of its steps in some
    version, and not a member of a parallel group (a group settles together)."""
    versions = parts.catalog.versions(saga) if isinstance(saga, str) else []
    if not versions:
        known = ", ".join(repr(name) for name in parts.catalog.names()) or "none"
        raise UnknownSagaError(f"no saga named {saga!r} is registered here (known: {known})")
    if step is None:
        return
    if not isinstance(step, str) or not any(d.find_step(step) for d in versions):
        raise SagaError(f"saga {saga!r} has no step named {step!r}")
    for definition in versions:
        for node in definition.nodes:
            if isinstance(node, ParallelNode) and any(s.name == step for s in node.steps):
                raise SagaError(
                    f"step {step!r} of saga {saga!r} is a member of the parallel group "
                    f"{node.name!r}, whose members run and settle together: pause the step "
                    "after the group, or the whole saga"
                )


def pause(
    parts: WorkerParts,
    saga: str,
    step: str | None,
    reason: str,
    actor: str | None,
    dry_run: bool = False,
) -> Pause:
    """``engine.pause``: store the pause of ``step`` of ``saga`` (None: the whole saga);
    ``dry_run``: every check made, the pause it would store returned, nothing stored."""
    check_actor(actor)
    check_reason(reason, "a pause reason")
    if not isinstance(reason, str) or not reason.strip():
        raise SagaError("a pause needs a reason (say why, for whoever unpauses it)")
    _check_names(parts, saga, step)
    if dry_run:
        return Pause(saga, step, reason, actor, get_clock().now())
    parts.store.ensure_schema()
    with parts.tracer.operation("pause", actor, _named(saga, step)):
        stored = parts.store.run(
            f"pausing {saga!r}",
            lambda: pauses.pause(
                parts.db, saga, step, reason=reason, actor=actor, now=get_clock().now()
            ),
        )
    logger.warning(
        "saga %r: %s paused by %s: %s; runs that reach it are held at its door",
        saga,
        "every step" if step is None else f"step {step!r}",
        actor or "an operator",
        reason,
    )
    return stored


def _named(saga: str, step: str | None) -> dict[str, str]:
    return {"saga.name": saga} if step is None else {"saga.name": saga, "saga.step": step}


def list_pauses(parts: WorkerParts) -> list[Pause]:
    """``engine.pauses``: every stored pause, with how many runs each holds."""
    parts.store.ensure_schema()
    return parts.store.run("listing the pauses", lambda: pauses.list_pauses(parts.db))


def unpause(
    parts: WorkerParts,
    saga: str,
    step: str | None,
    *,
    rate: float | None,
    actor: str | None,
    reason: str | None,
    progress: Callable[[int], None] | None = None,
    dry_run: bool = False,
) -> Unpaused:
    """``engine.unpause``: lift the pause, then release the runs it held, at most ``rate``
    a second (None: as fast as they can be written); ``progress`` is told each count.
    ``dry_run``: the pause it would lift and how many runs it holds now; nothing changed."""
    check_actor(actor)
    check_reason(reason, "an unpause reason")
    if rate is not None and not rate > 0:
        raise SagaError(f"an unpause rate must be above zero, got {rate!r}")
    _check_names(parts, saga, step)
    parts.store.ensure_schema()
    if dry_run:
        stored = [p for p in list_pauses(parts) if (p.saga, p.step) == (saga, step)]
        return Unpaused(stored[0] if stored else None, stored[0].held if stored else 0)
    # One span for the unpause; each run's release is a span of its run's trace, linked.
    with parts.tracer.operation("unpause", actor, _named(saga, step)) as span:
        unpaused = _unpause(parts, saga, step, rate, (actor, reason), progress)
        parts.tracer.noted(span, "saga.released", unpaused.released)
    return unpaused


def _unpause(
    parts: WorkerParts,
    saga: str,
    step: str | None,
    rate: float | None,
    by: tuple[str | None, str | None],
    progress: Callable[[int], None] | None,
) -> Unpaused:
    actor, reason = by
    lifted = parts.store.run(f"unpausing {saga!r}", lambda: pauses.unpause(parts.db, saga, step))
    logger.warning(
        "saga %r: %s unpaused by %s%s",
        saga,
        "every step" if step is None else f"step {step!r}",
        actor or "an operator",
        "" if lifted is not None else " (it was not paused: releasing what a pause left held)",
    )
    released, seen, begun = 0, set[str](), time.monotonic()
    while True:
        page = parts.store.run(
            "reading the runs a pause held",
            lambda: pauses.held_by(parts.db, saga, step, limit=PAGE),
        )
        fresh = [execution_id for execution_id in page if execution_id not in seen]
        if not fresh:
            break
        for execution_id in fresh:
            seen.add(execution_id)
            if rate is not None:  # the n-th release is due n/rate seconds after the first
                time.sleep(max(0.0, begun + released / rate - time.monotonic()))
            if release_run(parts, execution_id, actor, reason):
                released += 1
                if progress is not None:
                    progress(released)
    return Unpaused(lifted, released)


def release_run(
    parts: WorkerParts, execution_id: str, actor: str | None, reason: str | None
) -> bool:
    """Release one run held at a paused step's door: here, or handed on to a worker with
    its version (True: released, or handed on to be)."""
    try:
        definition, record = run_of(parts, execution_id)
    except VersionNotDeployedError as missing:
        parts.publisher.hand_on(missing, execution_id, "release", actor=actor, reason=reason)
        return True
    except SagaError as gone:  # cleaned up meanwhile: its row went with it
        logger.info("execution %s: not released: %s", execution_id, gone)
        return False
    with parts.tracer.action("release", execution_id, actor, record.trace_context):
        return bool(
            parts.store.run(
                f"releasing {execution_id!r} from a paused step",
                lambda: parts.executor.release_paused(definition, execution_id, actor, reason),
            )
        )


def _release_handed_on(parts: WorkerParts, execution_id: str, arguments: dict[str, Any]) -> None:
    release_run(parts, execution_id, arguments.get("actor"), arguments.get("reason"))


#: A worker's side of the release a process without the run's version hands on.
HANDED_ON: dict[str, Callable[[WorkerParts, str, dict[str, Any]], None]] = {
    "release": _release_handed_on,
}
