"""The pages: runs (filters, counts per state, parked runs first), one run (graph,
timeline, history, input and results, what its saga marks sensitive redacted as ``celery
saga show`` redacts it), and the action forms' targets."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, abort, current_app, g, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from markupsafe import Markup
from sqlalchemy.exc import SQLAlchemyError

from celery_saga.cli import timeline, waiting
from celery_saga.cli.output import as_json
from celery_saga.cli.redacted import redacted
from celery_saga.cli.version_names import version_hashes
from celery_saga.errors import SagaError
from celery_saga.records import ExecutionState
from celery_saga.runtime.clock import get_clock
from celery_saga.store import inspection
from celery_saga.store.queries import Page
from celery_saga.store.versions import waiting_for_version
from celery_saga.web import actions, graph, timeline_bars, timeline_svg
from celery_saga.web.listing import SORTS, ListQuery, filters_of, matches_text, reasons
from celery_saga.web.settings import WebSettings
from celery_saga.worker.engine import SagaEngine

pages = Blueprint("saga_web", __name__, template_folder="templates")

STATES = [state.value for state in ExecutionState]
#: What the page says after an action; the URL carries only the action's name.
DONE = {
    "resume": "Resumed: the workers carry the unwind on.",
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
    query = ListQuery.from_args(request.args)
    limit = _settings().page_size
    problem: str | None = None
    page = parked = Page((), None)
    counts: dict[str, int] = {}
    why: dict[str, str] = {}
    known: list[Any] = []
    try:
        engine.ensure_schema()
        known = engine.versions()
        for (_, state), number in inspection.run_counts(engine.db).items():
            counts[state] = counts.get(state, 0) + number
        stuck = inspection.Filters(states=[ExecutionState.COMPENSATION_STUCK])
        parked = inspection.list_runs(engine.db, stuck, archived=False, limit=limit, cursor=None)
        hashes = version_hashes(engine, [query.version] if query.version else [])
        filters = filters_of(query, get_clock().now(), hashes)
        page = inspection.list_runs(
            engine.db,
            filters,
            archived=query.archived == "1",
            limit=limit,
            cursor=query.cursor or None,
            newest_first=query.newest_first,
        )
        why = reasons(engine.db, engine.catalog, page.items, query.archived == "1")
    except (ValueError, UnicodeDecodeError):
        problem = f"{query.cursor!r} is not a cursor of this page"
    except SagaError as error:
        problem = str(error)
    except SQLAlchemyError as error:
        problem = _store_failure(error)
    listed = [r for r in page.items if matches_text(r, query.text, engine.catalog)]
    next_args = query.with_cursor(page.next_cursor) if page.next_cursor else None
    return render_template(
        "saga_web/runs.html",
        query=query,
        states=STATES,
        sagas=sorted({v.saga for v in known}),
        versions=[(v.saga, v.hash, v.label) for v in known],
        counts=sorted(counts.items()),
        parked=parked.items,
        runs=listed,
        reasons=why,
        sorts=SORTS,
        scanned=len(page.items),
        next_args=next_args,
        problem=problem,
    ), (400 if problem else 200)


def _described(engine: SagaEngine, execution_id: str) -> tuple[dict[str, Any], Any]:
    engine.ensure_schema()
    stored = inspection.load_run(engine.db, execution_id)
    if stored is None:
        abort(404, f"no saga execution with id {execution_id!r}")
    described = timeline.describe(
        stored, lambda run_id: inspection.load_run(engine.db, run_id), engine.catalog
    )
    shown = redacted(described, engine.catalog)
    waits = waiting_for_version(engine.db, [execution_id])
    shown["waiting_for_version"] = (
        waits[execution_id].definition_hash if execution_id in waits else None
    )
    shown["cursor"] = stored.record.cursor
    shown["waiting"] = waiting.described(shown)
    return shown, stored


# ``path``: a run id may hold ``/`` (``start`` allows it); an action is the last segment.
@pages.route("/runs/<path:execution_id>")
def run(execution_id: str) -> ResponseReturnValue:
    return _run_page(execution_id, request.args.get("done", ""), None)


def _run_page(execution_id: str, done: str, refused: str | None) -> ResponseReturnValue:
    engine = _engine()
    shown, stored = _described(engine, execution_id)
    definition = engine.catalog(stored.record.saga_name, stored.record.definition_hash)
    boxes = graph.draw(definition, shown) if definition is not None else None
    results = {s["name"]: s["result"] for s in shown["steps"] if s["result"] is not None}
    bars = timeline_bars.bars_of(stored, _run_url)
    return render_template(
        "saga_web/run.html",
        run=shown,
        boxes=boxes,
        timeline_lines=timeline.render(shown),
        # the renderer escapes every name it draws
        timeline_picture=Markup(
            timeline_svg.render(bars, get_clock().now(), stored.record.created_at)
        ),
        input_json=as_json(shown["input"]),
        results_json=as_json(results),
        as_json=as_json,
        live=stored.archived_at is None,
        done=DONE.get(done),
        refused=refused,
        tokens=_form_tokens(execution_id),
    ), (409 if refused else 200)


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
    _, stored = _described(engine, execution_id)
    try:
        if stored.archived_at is not None:
            raise SagaError(f"execution {execution_id!r} is archived; archived runs are read-only")
        actions.carry_out(engine, execution_id, action, request.form, g.user)
    except SagaError as error:
        return _run_page(execution_id, "", str(error))
    except SQLAlchemyError as error:
        return _run_page(execution_id, "", _store_failure(error))
    return redirect(url_for("saga_web.run", execution_id=execution_id, done=action), 303)
