"""The admin's operator actions: resume, resolve, abandon, signal, cancel, and retry, skip and
unwind a held run, through the engine's public API, each recorded in the run's history (by the
engine) with the Django user who took it; ``plans`` says what a move would do, for its
confirmation page."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest
from django.template.response import TemplateResponse

from celery_saga.contrib.django.app import project_engine
from celery_saga.decisions.cancel import CancelVerdict
from celery_saga.decisions.plan import PLANNERS
from celery_saga.errors import InvalidStateError, SagaError
from celery_saga.inspect.plan_text import plan_lines
from celery_saga.worker.bulk import BulkReport
from celery_saga.worker.engine import SagaEngine
from celery_saga.worker.run_commands import NO_OP

#: What the history's ``detail`` says of where an action came from.
FROM_ADMIN = "from the Django admin"


def _json_field(help_text: str) -> Any:
    """A form's optional field of JSON text (read with ``json_or_none``)."""
    return forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 6, "cols": 60}), help_text=help_text
    )


class SignalForm(forms.Form):  # type: ignore[misc]
    event = forms.CharField(max_length=200, help_text="The event the run waits for.")
    payload = _json_field(
        'The signal\'s payload as JSON (for example {"approved": true}); empty: none.'
    )

    def clean_payload(self) -> Any:
        return json_or_none(self.cleaned_data["payload"])


def json_or_none(text: Any) -> Any:
    """A form's JSON field: its value, None when left empty, a form error when not JSON."""
    stripped = str(text).strip()
    if not stripped:
        return None
    try:
        return json.loads(stripped)
    except ValueError as error:
        raise forms.ValidationError(f"not JSON: {error}") from None


class CancelForm(forms.Form):  # type: ignore[misc]
    reason = forms.CharField(
        required=False,
        max_length=500,
        help_text="Why (optional): the runs' failure reason and history record it.",
    )


class ResolveForm(forms.Form):  # type: ignore[misc]
    note = forms.CharField(
        max_length=2000,
        help_text="What was done by hand in place of the failed reversal: the history keeps it.",
    )


class HeldMoveForm(forms.Form):  # type: ignore[misc]
    reason = forms.CharField(
        required=False, max_length=500, help_text="Why (optional): the runs' history records it."
    )


class SkipForm(HeldMoveForm):
    result = _json_field(
        "The held step's result as JSON, checked against its output_schema; empty: none."
    )

    def clean_result(self) -> Any:
        return json_or_none(self.cleaned_data["result"])


def actor_of(request: HttpRequest) -> str:
    """Who took the action, as the history names them: the Django username."""
    return str(request.user.get_username())


Act = Callable[[SagaEngine, str, str], None]


def carry_out(run_ids: Iterable[str], act: Act, actor: str) -> tuple[list[str], list[str]]:
    """``act`` on each run as ``actor`` (the engine records it in the run's history, in the
    transaction of the action); (what was done, what was refused)."""
    engine = project_engine()
    if engine is None:
        return [], ["no saga engine: set SAGA_CELERY_APP to the Celery app that has one"]
    done, refused = [], []
    for execution_id in run_ids:
        try:
            act(engine, execution_id, actor)
        except SagaError as error:
            refused.append(f"{execution_id}: {error}")
            continue
        done.append(execution_id)
    return done, refused


def resume(engine: SagaEngine, execution_id: str, actor: str) -> None:
    engine.resume_compensation(execution_id, actor=actor)


def abandon(engine: SagaEngine, execution_id: str, actor: str) -> None:
    engine.abandon_compensation(execution_id, actor=actor, reason=FROM_ADMIN)


def resolve(note: str) -> Act:
    """Record each run's parked reversal as done by hand with ``note``."""

    def by_hand(engine: SagaEngine, execution_id: str, actor: str) -> None:
        plan = engine.plan(execution_id, "resolve")
        if plan.refused is not None or plan.step is None:
            raise InvalidStateError(f"execution {execution_id!r}: {plan.refused}")
        engine.resolve(execution_id, step=plan.step, note=note, actor=actor)

    return by_hand


def plans(run_ids: Iterable[str], move: str) -> dict[str, str]:
    """What ``move`` would do to each run, as ``celery saga plan`` prints it (none for a
    move that is not planned, or without an engine)."""
    engine = project_engine()
    if engine is None or move not in PLANNERS:
        return {}
    return {run_id: "\n".join(plan_lines(engine.plan(run_id, move))) for run_id in run_ids}


def signal(event: str, payload: Any) -> Act:
    def send(engine: SagaEngine, execution_id: str, actor: str) -> None:
        engine.signal(execution_id, event, payload, actor=actor)

    return send


def cancel(reason: str) -> Act:
    """Cancel with ``reason`` (none when blank); a run already cancelled or unwinding is
    left as it is and shown as refused, as the web view and the CLI say."""

    def stop(engine: SagaEngine, execution_id: str, actor: str) -> None:
        verdict = engine.cancel(execution_id, reason.strip() or None, actor=actor)
        if verdict is not CancelVerdict.CANCEL:
            raise SagaError(f"execution {execution_id} {NO_OP[verdict]}")

    return stop


#: An engine call on a held run: (engine, run id, actor, reason, the form's data).
HeldCall = Callable[[SagaEngine, str, str, str, dict[str, Any]], None]


@dataclass(frozen=True)
class HeldMove:
    """An admin action on held runs: its name, the question it asks first with ``form``,
    the engine call it makes, and what the page says it did."""

    name: str
    question: str
    form: type[HeldMoveForm]
    call: HeldCall
    done: str

    def act(self, data: dict[str, Any]) -> Act:
        """The call with the form's data (a blank reason: where it came from)."""
        reason = str(data.get("reason") or "").strip() or FROM_ADMIN

        def move(engine: SagaEngine, execution_id: str, actor: str) -> None:
            self.call(engine, execution_id, actor, reason, data)

        return move


def _retry(engine: SagaEngine, run_id: str, actor: str, reason: str, _: dict[str, Any]) -> None:
    engine.retry(run_id, actor=actor, reason=reason)


def _skip(engine: SagaEngine, run_id: str, actor: str, reason: str, data: dict[str, Any]) -> None:
    engine.skip(run_id, result=data.get("result"), actor=actor, reason=reason)


def _unwind(engine: SagaEngine, run_id: str, actor: str, reason: str, _: dict[str, Any]) -> None:
    engine.unwind(run_id, actor=actor, reason=reason)


HELD_MOVES = {
    move.name: move
    for move in (
        HeldMove(
            "retry",
            "Run the held step of these runs again, with a fresh set of attempts?",
            HeldMoveForm,
            _retry,
            "retried",
        ),
        HeldMove(
            "skip",
            "Record the held step of these runs completed by hand, with this result?",
            SkipForm,
            _skip,
            "skipped",
        ),
        HeldMove(
            "unwind",
            "Unwind these held runs? What each did is reversed and it ends failed.",
            HeldMoveForm,
            _unwind,
            "unwound",
        ),
    )
}


def bulk(move: str, where: list[str], actor: str, reason: str | None) -> BulkReport:
    """``move`` on every run ``where`` selects, as one bulk operation (``engine.bulk``)."""
    engine = project_engine()
    if engine is None:
        raise SagaError("no saga engine: set SAGA_CELERY_APP to the Celery app that has one")
    return engine.bulk(move, where, actor=actor, reason=reason or FROM_ADMIN)


def where_of(query: Mapping[str, str]) -> list[str]:
    """The ``--where`` terms of a changelist's search (``label.KEY=VALUE``) and filters."""
    terms = [f"{key}={query[key]}" for key in ("saga", "state") if query.get(key)]
    search = query.get("q", "").strip()
    if search.startswith("label.") and "=" in search:
        terms.append(search)
    return terms


#: Asks the operator first: (question, form) -> the confirmation page.
Confirm = Callable[[str, CancelForm], TemplateResponse]


def bulk_from_changelist(
    request: HttpRequest, move: str, confirm: Confirm
) -> tuple[TemplateResponse | None, list[tuple[str, int]]]:
    """The admin's bulk ``move`` over the runs its changelist's search (``label.KEY=VALUE``)
    and filters select, not only the ones ticked: the confirmation page first, then one
    operation, named in each run's history. Returns (the page, or None; the messages)."""
    where = where_of(request.GET)
    if not where:
        explain = "search for label.KEY=VALUE or filter by saga or state first: a bulk move "
        return None, [(explain + "acts on every run they select", messages.ERROR)]
    form = CancelForm(request.POST if "apply" in request.POST else None)
    if not form.is_valid():
        question = f"{move.capitalize()} every run where {' '.join(where)}, as one operation?"
        return confirm(question, form), []
    try:
        done = bulk(move, where, actor_of(request), form.cleaned_data["reason"])
    except SagaError as error:
        return None, [(f"refused: {error}", messages.ERROR)]
    said = f"bulk {move} {done.operation_id}: {done.acted} run(s) acted on, "
    return None, [(said + f"{done.refused} refused or unchanged", messages.SUCCESS)]
