"""The run list's operator actions as the Django admin calls them: one function of
``(modeladmin, request, queryset)`` each, behind its permission, that asks first on the
confirmation page (``confirm``) when the move needs it and then acts through ``actions``
(the engine's calls), telling the user what was done and what was refused."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from celery_saga.contrib.django import actions as run_actions

_CONFIRM = "admin/celery_saga/run/action.html"
F = TypeVar("F", bound=Callable[..., Any])


def action(**options: Any) -> Callable[[F], F]:
    """``admin.action``, typed: mypy keeps the function's own signature."""
    decorate: Callable[[F], F] = admin.action(**options)
    return decorate


@action(description="Retry the held step (asks first)", permissions=["move_held"])
def retry(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
    return _held_move(modeladmin, request, queryset, run_actions.HELD_MOVES["retry"])


@action(description="Skip the held step by hand (asks first)", permissions=["move_held"])
def skip(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
    return _held_move(modeladmin, request, queryset, run_actions.HELD_MOVES["skip"])


@action(description="Unwind the held run (asks first)", permissions=["move_held"])
def unwind(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
    return _held_move(modeladmin, request, queryset, run_actions.HELD_MOVES["unwind"])


def _held_move(
    modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any], move: run_actions.HeldMove
) -> HttpResponse | None:
    """A move on held runs, asked first with its form (a reason; a skip's result)."""
    form = move.form(request.POST if "apply" in request.POST else None)
    if not form.is_valid():
        return confirm(modeladmin, request, queryset, move.name, move.question, form)
    _act(modeladmin, request, queryset, move.act(form.cleaned_data), move.done)
    return None


@action(description="Resume the parked unwind", permissions=["resume"])
def resume(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> None:
    _act(modeladmin, request, queryset, run_actions.resume, "resumed")


@action(description="Resolve the parked reversal: done by hand", permissions=["resume"])
def resolve(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
    form = run_actions.ResolveForm(request.POST if "apply" in request.POST else None)
    if not form.is_valid():
        question = "Record each run's failed reversal as done by hand, and go on?"
        return confirm(modeladmin, request, queryset, "resolve", question, form)
    act = run_actions.resolve(form.cleaned_data["note"])
    _act(modeladmin, request, queryset, act, "resolved")
    return None


@action(description="Abandon the parked unwind", permissions=["abandon"])
def abandon(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
    if "apply" not in request.POST:
        question = (
            "Abandon the unwind of these runs? Their outstanding reversals are marked "
            "skipped and the runs end failed with rollback status stuck; nothing undoes it."
        )
        return confirm(modeladmin, request, queryset, "abandon", question, None)
    _act(modeladmin, request, queryset, run_actions.abandon, "abandoned")
    return None


@action(description="Signal an event", permissions=["signal"])
def signal(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
    form = run_actions.SignalForm(request.POST if "apply" in request.POST else None)
    if not form.is_valid():
        return confirm(modeladmin, request, queryset, "signal", "Signal these runs:", form)
    act = run_actions.signal(form.cleaned_data["event"], form.cleaned_data["payload"])
    _act(modeladmin, request, queryset, act, "signalled")
    return None


@action(description="Cancel the run (asks first)", permissions=["cancel"])
def cancel(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
    form = run_actions.CancelForm(request.POST if "apply" in request.POST else None)
    if not form.is_valid():
        question = (
            "Cancel these runs? No step starts any more, the bodies in flight are stopped "
            "and what each run did is unwound; it ends cancelled."
        )
        return confirm(modeladmin, request, queryset, "cancel", question, form)
    act = run_actions.cancel(form.cleaned_data["reason"])
    _act(modeladmin, request, queryset, act, "cancelled")
    return None


def _bulk_action(move: str, description: str, permission: str) -> Callable[..., Any]:
    """The admin action ``bulk_<move>``: ``move`` on every run the search and filters select."""

    def act(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        return _bulk(modeladmin, request, queryset, move)

    act.__name__ = act.__qualname__ = f"bulk_{move}"
    return action(description=description, permissions=[permission])(act)


bulk_cancel = _bulk_action(
    "cancel", "Cancel every run the search and filters select, as one operation", "cancel"
)
bulk_resume = _bulk_action(
    "resume", "Resume every parked run the search and filters select, as one operation", "resume"
)
bulk_abandon = _bulk_action(
    "abandon",
    "Abandon every parked unwind the search and filters select, as one operation",
    "abandon",
)
bulk_retry = _bulk_action(
    "retry", "Retry every held run the search and filters select, as one operation", "move_held"
)
bulk_unwind = _bulk_action(
    "unwind", "Unwind every held run the search and filters select, as one operation", "move_held"
)


def _bulk(
    modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any], move: str
) -> HttpResponse | None:
    """``move`` on every run the changelist's search and filters select."""
    asks = functools.partial(confirm, modeladmin, request, queryset[:20], f"bulk_{move}")
    done, said = run_actions.bulk_from_changelist(request, move, asks)
    for text, level in said:
        modeladmin.message_user(request, text, level)
    return done


def _act(
    modeladmin: Any,
    request: HttpRequest,
    queryset: QuerySet[Any],
    act: run_actions.Act,
    kind: str,
) -> None:
    run_ids = list(queryset.values_list("id", flat=True))
    done, refused = run_actions.carry_out(run_ids, act, run_actions.actor_of(request))
    if done:
        modeladmin.message_user(request, f"{kind}: {', '.join(done)}", messages.SUCCESS)
    for reason in refused:
        modeladmin.message_user(request, f"refused: {reason}", messages.ERROR)


def confirm(
    modeladmin: Any,
    request: HttpRequest,
    queryset: QuerySet[Any],
    action: str,
    question: str,
    form: forms.Form | None,
) -> TemplateResponse:
    """The page that asks before ``action`` acts on the selected runs, with its plan for
    each (``actions.plans``) and the move's form."""
    runs = list(queryset)
    plans = run_actions.plans([run.pk for run in runs], action)
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": question,
        "opts": modeladmin.model._meta,
        "runs": runs,
        "planned": [(run, plans.get(run.pk)) for run in runs],
        "action": action,
        "form": form,
        "selected": admin.helpers.ACTION_CHECKBOX_NAME,
    }
    return TemplateResponse(request, _CONFIRM, context)
