"""The view's operator actions: signal, resume, resolve, abandon, cancel, and retry, skip and
unwind a held run, through the engine's public API, each recorded by the engine in the run's
history as taken by ``web:<user>``; ``plans`` says what each move open to a run would do (its
confirmation)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from celery_saga.decisions.cancel import CancelVerdict
from celery_saga.decisions.plan import Plan
from celery_saga.errors import SagaError
from celery_saga.typed_payload import parse_payload
from celery_saga.worker.engine import SagaEngine
from celery_saga.worker.run_commands import NO_OP

FROM_WEB = "from the web view"

#: (engine, run id, the form's fields, actor) -> what the page says; raises SagaError.
Act = Callable[[SagaEngine, str, Mapping[str, str], str], str]


def actor(user: str) -> str:
    """Who the history names for an action a user of this view took."""
    return f"web:{user}"


def _resume(engine: SagaEngine, execution_id: str, form: Mapping[str, str], by: str) -> str:
    engine.resume_compensation(execution_id, actor=by)
    return FROM_WEB


def _resolve(engine: SagaEngine, execution_id: str, form: Mapping[str, str], by: str) -> str:
    step = form.get("step", "").strip()
    engine.resolve(execution_id, step=step, note=form.get("note", ""), actor=by)
    return f"{FROM_WEB}: the reversal of {step} recorded as done by hand"


def _abandon(engine: SagaEngine, execution_id: str, form: Mapping[str, str], by: str) -> str:
    skipped = engine.abandon_compensation(execution_id, actor=by, reason=FROM_WEB)
    return f"{FROM_WEB}: {skipped} step(s) marked compensation_skipped"


def _cancel(engine: SagaEngine, execution_id: str, form: Mapping[str, str], by: str) -> str:
    reason = form.get("reason", "").strip() or None
    verdict = engine.cancel(execution_id, reason, actor=by)
    if verdict is not CancelVerdict.CANCEL:
        raise SagaError(f"execution {execution_id} {NO_OP[verdict]}")
    return FROM_WEB + (f": {reason}" if reason else "")


def payload_of(text: str) -> Any:
    """The signal's payload from the form: JSON, or None when left empty."""
    return parse_payload(text) if text.strip() else None


def _signal(engine: SagaEngine, execution_id: str, form: Mapping[str, str], by: str) -> str:
    event = form.get("event", "").strip()
    if not event:
        raise SagaError("a signal needs an event")
    resumed = engine.signal(execution_id, event, payload_of(form.get("payload", "")), actor=by)
    then = "the run resumed" if resumed else "the run takes it at its gate"
    return f"{FROM_WEB}: event {event!r}, {then}"


def _why(form: Mapping[str, str]) -> str:
    return form.get("reason", "").strip() or FROM_WEB


def _retry(engine: SagaEngine, execution_id: str, form: Mapping[str, str], by: str) -> str:
    engine.retry(execution_id, actor=by, reason=_why(form))
    return FROM_WEB


def _skip(engine: SagaEngine, execution_id: str, form: Mapping[str, str], by: str) -> str:
    result = payload_of(form.get("result", ""))
    engine.skip(execution_id, result=result, actor=by, reason=_why(form))
    return FROM_WEB


def _unwind(engine: SagaEngine, execution_id: str, form: Mapping[str, str], by: str) -> str:
    engine.unwind(execution_id, actor=by, reason=_why(form))
    return FROM_WEB


#: action name in the URL -> (history kind, what it does)
ACTIONS: dict[str, tuple[str, Act]] = {
    "resume": ("resumed", _resume),
    "resolve": ("resolved", _resolve),
    "abandon": ("abandoned", _abandon),
    "cancel": ("cancelled", _cancel),
    "signal": ("signalled", _signal),
    "retry": ("hold-retried", _retry),
    "skip": ("hold-skipped", _skip),
    "unwind": ("hold-unwound", _unwind),
}


#: The run's state -> the moves open to it whose plan its page shows with their forms.
PLANNED = {
    "compensation_stuck": ("resume", "resolve", "abandon"),
    "running": ("cancel",),
    "waiting": ("cancel",),
    "queued": ("cancel",),
    "held": ("retry", "skip", "unwind", "cancel"),
}


def plans(engine: SagaEngine, execution_id: str, state: str) -> dict[str, Plan]:
    """What each move open to the run would do now (``engine.plan``), by move."""
    return {move: engine.plan(execution_id, move) for move in PLANNED.get(state, ())}


def carry_out(
    engine: SagaEngine, execution_id: str, action: str, form: Mapping[str, str], user: str
) -> str:
    """Take ``action`` on the run as ``web:<user>`` (the engine records it); returns what
    the page says. Raises ``SagaError`` (and records nothing) when the engine refuses."""
    _kind, act = ACTIONS[action]
    return act(engine, execution_id, form, actor(user))
