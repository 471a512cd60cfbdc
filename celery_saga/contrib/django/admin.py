"""Runs, their steps and their history in the Django admin: read-only pages over the saga
tables, with the operator actions of ``admin_actions`` (each behind its own permission); pages
read from a replica behind the store say so (``staleness``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.contrib import admin, messages
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from celery_saga.contrib.django import admin_actions, labels, staleness
from celery_saga.contrib.django.app import project_engine
from celery_saga.contrib.django.lookups import only_filter_lookups
from celery_saga.contrib.django.models import HistoryRow, PausedRun, PausedStep, Run, Step
from celery_saga.contrib.django.payloads import shown
from celery_saga.contrib.django.story import graph_html, timeline_html
from celery_saga.definition.run_markings import UNREGISTERED, run_markings
from celery_saga.definition.sensitivity import Sensitivity
from celery_saga.inspect import RunView
from celery_saga.records import ExecutionState, RollbackStatus

#: Where a run's page keeps the read model it drew its fields from.
_READ = "saga_read_model"
F = TypeVar("F", bound=Callable[..., Any])


def display(**options: Any) -> Callable[[F], F]:
    """``admin.display``, typed: mypy keeps the method's own signature."""
    decorate: Callable[[F], F] = admin.display(**options)
    return decorate


def _pre(blob: bytes | memoryview | None, run: Run, *path: str) -> str:
    """A payload of ``run`` at ``path``, with what its saga marks sensitive redacted."""
    text = shown(blob, path, _marks(run))
    return str(format_html('<pre style="white-space: pre-wrap">{}</pre>', text))


def _marks(run: Run) -> Sensitivity:
    """The run's markings (``run_markings``): a sub-saga's record by the child's own, and
    all of it when this process has no engine or does not have the saga."""
    engine = project_engine()
    if engine is None:
        return UNREGISTERED
    return run_markings(engine.catalog, run.saga_name, run.definition_hash)


def _view(run: Run) -> RunView | None:
    """The run through the read API (redacted as ``celery saga show`` redacts it), the
    graph and timeline every view draws; None without an engine in this process."""
    if not hasattr(run, _READ):  # one read for the page's three fields
        engine = project_engine()
        setattr(run, _READ, None if engine is None else engine.inspect().find_run(run.id))
    view: RunView | None = getattr(run, _READ)
    return view


def _run_link(execution_id: str | None) -> str:
    if not execution_id:
        return "-"
    url = reverse("admin:celery_saga_run_change", args=[execution_id])
    return str(format_html('<a href="{}">{}</a>', url, execution_id))


class ReadOnly:
    """Nothing here is added, changed or deleted: the engine's own calls change runs."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class SaysStaleness:
    """A list or a page read from a replica behind the store says so, and by how much."""

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        _say_staleness(request)
        parent: Any = super()
        shown: HttpResponse = parent.changelist_view(request, extra_context)
        return shown

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        _say_staleness(request)
        parent: Any = super()
        shown: HttpResponse = parent.change_view(request, object_id, form_url, extra_context)
        return shown


def _say_staleness(request: HttpRequest) -> None:
    lag = staleness.replica_lag()
    if lag.worth_saying:
        messages.warning(request, lag.describe())


class SagaFilter(admin.SimpleListFilter):  # type: ignore[misc]
    """The sagas this process knows: no scan of the runs for their distinct names."""

    title, parameter_name = "saga", "saga"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        engine = project_engine()
        names = engine.catalog.names() if engine is not None else []
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(saga_name=self.value()) if self.value() else queryset


class StateFilter(admin.SimpleListFilter):  # type: ignore[misc]
    title, parameter_name = "state", "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(state.value, state.value) for state in ExecutionState]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(state=self.value()) if self.value() else queryset


class RollbackFilter(StateFilter):
    title, parameter_name = "rollback status", "rollback_status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(status.value, status.value) for status in RollbackStatus]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(rollback_status=self.value()) if self.value() else queryset


class StepInline(ReadOnly, admin.TabularInline):  # type: ignore[misc]
    model = Step
    fields = readonly_fields = (
        "node",
        "sub",
        "name",
        "status",
        "attempts",
        "started_at",
        "completed_at",
        "error",
        "compensation_status",
        "compensation_attempts",
        "compensation_reason",
        "result_shown",
        "holder",
    )
    extra, max_num, show_change_link = 0, 0, False

    @display(description="result")
    def result_shown(self, step: Step) -> str:
        return _pre(step.result, step.run, "results", step.name)


class HistoryInline(ReadOnly, admin.TabularInline):  # type: ignore[misc]
    model = HistoryRow
    fields = readonly_fields = (
        "at",
        "kind",
        "step",
        "attempt",
        "started_at",
        "actor",
        "holder",
        "detail",
        "data_shown",
    )
    extra, max_num = 0, 0

    @display(description="data")
    def data_shown(self, row: HistoryRow) -> str:
        return _pre(row.data, row.run, "results", row.step or "")


@admin.register(Run)
class RunAdmin(SaysStaleness, ReadOnly, admin.ModelAdmin):  # type: ignore[misc]
    list_display = ("id", "saga_name", "state", "rollback_status", "created_at", "updated_at")
    list_filter = (SagaFilter, StateFilter, RollbackFilter)
    lookup_allowed = only_filter_lookups
    search_fields = ("id",)
    search_help_text = (
        "A run's id, or its parent's: the whole id; or label.KEY=VALUE: the runs started "
        "with that label (select them all, then act on them)."
    )
    # Counting every run on each page is a scan of the table: show the filtered count only.
    show_full_result_count = False
    readonly_fields = (
        "id",
        "saga_name",
        "definition_hash",
        "state",
        "node_at",
        "waiting",
        "graph",
        "timeline",
        "input_shown",
        "labels",
        "failure_reason",
        "rollback_status",
        "rollback_reason",
        "parent",
        "created_at",
        "updated_at",
        "committed_at",
        "wake_at",
        "deadline_at",
        "cancelled_at",
    )
    fields = readonly_fields
    inlines = (StepInline, HistoryInline)
    actions = (
        admin_actions.resume,
        admin_actions.resolve,
        admin_actions.abandon,
        admin_actions.signal,
        admin_actions.cancel,
        admin_actions.retry,
        admin_actions.skip,
        admin_actions.unwind,
        admin_actions.bulk_cancel,
        admin_actions.bulk_resume,
        admin_actions.bulk_abandon,
        admin_actions.bulk_retry,
        admin_actions.bulk_unwind,
    )

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        # An exact id is a seek on the primary key (or the parent index); the admin's
        # default case-insensitive match would read every run.
        term = search_term.strip()
        if not term:
            return queryset, False
        if term.startswith("label.") and "=" in term:
            return labels.labelled(queryset, term), False
        return queryset.filter(Q(id=term) | Q(parent_execution_id=term)), False

    @display(description="at node")
    def node_at(self, run: Run) -> str:
        return f"{run.cursor}.{run.cursor_sub}"

    @display(description="waiting for")
    def waiting(self, run: Run) -> str:
        view = _view(run)
        return (view.waiting if view is not None else None) or "-"

    @display(description="graph")
    def graph(self, run: Run) -> str:
        view = _view(run)
        return "-" if view is None else mark_safe(graph_html(view.graph))

    @display(description="timeline")
    def timeline(self, run: Run) -> str:
        view = _view(run)
        return "-" if view is None else mark_safe(timeline_html(view))

    @display(description="labels")
    def labels(self, run: Run) -> str:
        view = _view(run)
        shown = view.labels if view is not None else ()
        return "  ".join(f"{key}={value}" for key, value in shown) or "-"

    @display(description="input")
    def input_shown(self, run: Run) -> str:
        return _pre(run.input, run, "input")

    @display(description="parent run")
    def parent(self, run: Run) -> str:
        return _run_link(run.parent_execution_id)

    def has_resume_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("celery_saga.resume_run"))

    def has_abandon_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("celery_saga.abandon_run"))

    def has_signal_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("celery_saga.signal_run"))

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("celery_saga.cancel_run"))

    def has_move_held_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("celery_saga.move_held_run"))


@admin.register(Step)
class StepAdmin(SaysStaleness, ReadOnly, admin.ModelAdmin):  # type: ignore[misc]
    list_display = ("name", "run_link", "status", "attempts", "compensation_status", "started_at")
    list_filter = ("status", "compensation_status")
    lookup_allowed = only_filter_lookups
    search_fields = ("run__id",)
    search_help_text = "The run's whole id."
    show_full_result_count = False
    fields = readonly_fields = (
        "run_link",
        *StepInline.fields[:-2],
        "child",
        "result_shown",
        "holder",
    )
    result_shown = StepInline.result_shown

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        return (queryset.filter(run_id=term) if term else queryset), False

    @display(description="run", ordering="run_id")
    def run_link(self, step: Step) -> str:
        return _run_link(step.run_id)

    @display(description="child run")
    def child(self, step: Step) -> str:
        return _run_link(step.child_execution_id)


@admin.register(HistoryRow)
class HistoryAdmin(SaysStaleness, ReadOnly, admin.ModelAdmin):  # type: ignore[misc]
    list_display = ("at", "run_link", "kind", "step", "attempt", "actor", "detail")
    list_filter = ("kind",)
    lookup_allowed = only_filter_lookups
    search_fields = ("run__id",)
    search_help_text = "The run's whole id."
    show_full_result_count = False
    ordering = ("-id",)
    fields = readonly_fields = ("run_link", *HistoryInline.fields)
    data_shown = HistoryInline.data_shown
    get_search_results = StepAdmin.get_search_results
    run_link = StepAdmin.run_link


@admin.register(PausedStep)
class PausedStepAdmin(SaysStaleness, ReadOnly, admin.ModelAdmin):  # type: ignore[misc]
    """Paused steps, listed (``saga pause`` and ``saga unpause`` change them): a saga with
    two paused steps shares its key column, so no row links to a page."""

    list_display = ("saga_name", "step", "reason", "actor", "paused_at")
    list_display_links = None

    @display(description="step", ordering="step_name")
    def step(self, paused: PausedStep) -> str:
        return paused.step_name or "(every step)"


@admin.register(PausedRun)
class PausedRunAdmin(SaysStaleness, ReadOnly, admin.ModelAdmin):  # type: ignore[misc]
    list_display = ("run_link", "saga_name", "step_name", "pause_step", "held_at")
    list_display_links = None

    @display(description="run", ordering="run_id")
    def run_link(self, paused: PausedRun) -> str:
        return _run_link(paused.run_id)
