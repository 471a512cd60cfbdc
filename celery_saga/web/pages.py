"""The pages: runs (filters, counts per state, parked runs first), one run (graph,
timeline, history, input and results, what its saga marks sensitive redacted as ``celery
saga show`` redacts it), and the action forms' targets."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, abort, current_app, g, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from markupsafe import Markup
from sqlalchemy.exc import SQLAlchemyError

from celery_saga.decisions.plan import Plan
from celery_saga.errors import SagaError
from celery_saga.inspect import RunList, RunView
from celery_saga.inspect.jsonable import as_json
from celery_saga.inspect.plan_text import plan_lines
from celery_saga.inspect.text import run_lines
from celery_saga.records import ExecutionState
from celery_saga.runtime.clock import get_clock
from celery_saga.web import actions, timeline_bars, timeline_svg
from celery_saga.web.listing import SORTS, ListQuery, filters_of, matches_text
from celery_saga.web.settings import WebSettings
from celery_saga.worker.engine import SagaEngine

pages = Blueprint("saga_web", __name__, template_folder="templates")

STATES = [state.value for state in ExecutionState]
#: What the page says after an action; the URL carries only the action's name.
DONE = {
    "resume": "Resumed: the workers carry the unwind on.",
    "resolve": "Resolved: the reversal is recorded as done by hand; the workers carry on.",
    "abandon": "Abandoned: the steps not yet reversed are marked compensation_skipped.",
    "cancel": "Cancel stored: the workers stop the run and unwind what it did.",
    "signal": "Signal recorded.",
}


def _engine() -> SagaEngine:
    engine: SagaEngine = current_app.config["SAGA_ENGINE"]
    return engine


def _settings() -> WebSettings:
    settings: WebSettings = current_app.config["SAGA_WEB"]
    return settings


def _store_failure(error: SQLAlchemyError) -> str:
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"the saga store failed: {first}"


@pages.route("/")
def runs() -> ResponseReturnValue:
    engine = _engine()
    reads = engine.inspect()
    query = ListQuery.from_args(request.args)
    limit = _settings().page_size
    problem: str | None = None
    page = parked = RunList((), None)
    counts: dict[str, int] = {}
    known: list[Any] = []
    try:
        counts = reads.counts()
        known = engine.versions()
        parked = reads.parked(limit)
        hashes = reads.version_hashes([query.version] if query.version else [])
        page = reads.runs(
            filters_of(query, get_clock().now(), hashes),
            archived=query.archived == "1",
            limit=limit,
            cursor=query.cursor or None,
            newest_first=query.newest_first,
        )
    except SagaError as error:
        problem = str(error)
    except SQLAlchemyError as error:
        problem = _store_failure(error)
    listed = [r for r in page.items if matches_text(r.record, query.text, engine.catalog)]
    next_args = query.with_cursor(page.next_cursor) if page.next_cursor else None
    return render_template(
        "saga_web/runs.html",
        query=query,
        states=STATES,
        sagas=sorted({v.saga for v in known}),
        versions=[(v.saga, v.hash, v.label) for v in known],
        counts=sorted(counts.items()),
        parked=[r.record for r in parked.items],
        runs=[r.record for r in listed],
        reasons={r.record.id: r.reason for r in listed},
        sorts=SORTS,
        scanned=len(page.items),
        next_args=next_args,
        problem=problem,
    ), (400 if problem else 200)


def _shown(engine: SagaEngine, execution_id: str) -> RunView:
    """The run through the read API, redacted as ``celery saga show`` redacts it."""
    found = engine.inspect().find_run(execution_id)
    if found is None:
        abort(404, f"no saga execution with id {execution_id!r}")
    return found


# ``path``: a run id may hold ``/`` (``start`` allows it); an action is the last segment.
@pages.route("/runs/<path:execution_id>")
def run(execution_id: str) -> ResponseReturnValue:
    return _run_page(execution_id, request.args.get("done", ""), None)


def _run_page(execution_id: str, done: str, refused: str | None) -> ResponseReturnValue:
    shown = _shown(_engine(), execution_id)
    results = {s.name: s.result for s in shown.steps if s.result is not None}
    found = _plans(shown)
    return render_template(
        "saga_web/run.html",
        run=shown,
        record=shown.record,
        nodes=shown.graph if shown.definition_deployed else None,
        timeline_lines=run_lines(shown),
        # the renderer escapes every name it draws
        timeline_picture=Markup(
            timeline_svg.render(
                timeline_bars.bars_of(
                    shown.timeline,
                    _run_url,
                    {s.name: s.child.id for s in shown.steps if s.child is not None},
                ),
                get_clock().now(),
                shown.record.created_at,
            )
        ),
        input_json=as_json(shown.record.input),
        results_json=as_json(results),
        as_json=as_json,
        live=shown.archived_at is None,
        done=DONE.get(done),
        refused=refused,
        tokens=_form_tokens(execution_id),
        plans={move: plan_lines(plan) for move, plan in found.items()},
        parked_step=found["resolve"].step if "resolve" in found else None,
    ), (409 if refused else 200)


def _plans(shown: RunView) -> dict[str, Plan]:
    """Each open move's plan, shown (as ``celery saga plan`` prints it) beside its form."""
    if shown.archived_at is not None or not _settings().actions:
        return {}
    return actions.plans(_engine(), shown.id, shown.state)


def _run_url(execution_id: str) -> str:
    return url_for("saga_web.run", execution_id=execution_id)


def _form_tokens(execution_id: str) -> dict[str, str]:
    """Each action form's CSRF token, good for that action on this run only."""
    now = get_clock().now()
    return {action: g.forms.token(action, execution_id, now) for action in actions.ACTIONS}


@pages.route("/runs/<path:execution_id>/<action>", methods=["POST"])
def act(execution_id: str, action: str) -> ResponseReturnValue:
    if action not in actions.ACTIONS:
        abort(404)
    engine = _engine()
    shown = _shown(engine, execution_id)
    try:
        if shown.archived_at is not None:
            raise SagaError(f"execution {execution_id!r} is archived; archived runs are read-only")
        actions.carry_out(engine, execution_id, action, request.form, g.user)
    except SagaError as error:
        return _run_page(execution_id, "", str(error))
    except SQLAlchemyError as error:
        return _run_page(execution_id, "", _store_failure(error))
    return redirect(url_for("saga_web.run", execution_id=execution_id, done=action), 303)
