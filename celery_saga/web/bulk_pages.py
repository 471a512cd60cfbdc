"""Many runs at once from the runs page: ``GET /bulk`` shows what a move would act on (the
count and the first runs, nothing changed) with the form that makes it; ``POST
/bulk/<move>`` (its CSRF token, like every action's) makes it through ``engine.bulk``,
recorded in each moved run's history as taken by ``web:<user>`` with the operation's id.
The terms are ``--where``'s, one a line."""

from __future__ import annotations

from collections.abc import Mapping

from flask import abort, g, render_template, request
from flask.typing import ResponseReturnValue
from sqlalchemy.exc import SQLAlchemyError

from celery_saga.errors import SagaError
from celery_saga.runtime.clock import get_clock
from celery_saga.web import actions
from celery_saga.web.pages import _engine, _store_failure, pages
from celery_saga.worker.bulk import BulkReport
from celery_saga.worker.bulk_moves import MOVES


def _terms(values: Mapping[str, str] | None = None) -> list[str]:
    text = (request.values if values is None else values).get("where", "")
    return [line.strip() for line in text.splitlines() if line.strip()]


def form_terms(form: Mapping[str, str]) -> str:
    """What a bulk form's CSRF token is for: its terms, so that a token shown with one
    filter moves no other runs."""
    return "where:" + "\n".join(_terms(form))


def _page(
    move: str, preview: BulkReport | None, done: BulkReport | None, problem: str | None
) -> str:
    terms = form_terms({"where": "\n".join(_terms())})
    token = g.forms.token(move, terms, get_clock().now()) if move in MOVES else ""
    return render_template(
        "saga_web/bulk.html",
        moves=list(MOVES),
        move=move,
        where="\n".join(_terms()),
        preview=preview,
        done=done,
        problem=problem,
        token=token,
    )


@pages.route("/bulk")
def bulk_preview() -> ResponseReturnValue:
    move = request.args.get("move", "cancel")
    if move not in MOVES:
        abort(404)
    if not _terms():
        return _page(move, None, None, None)
    try:
        preview = _engine().bulk(move, _terms(), dry_run=True)
    except SagaError as error:
        return _page(move, None, None, str(error))
    except SQLAlchemyError as error:
        return _page(move, None, None, _store_failure(error))
    return _page(move, preview, None, None)


@pages.route("/bulk/<action>", methods=["POST"])
def bulk_apply(action: str) -> ResponseReturnValue:
    if action not in MOVES:
        abort(404)
    reason = request.form.get("reason", "").strip() or actions.FROM_WEB
    try:
        done = _engine().bulk(action, _terms(), actor=actions.actor(g.user), reason=reason)
    except SagaError as error:
        return _page(action, None, None, str(error))
    except SQLAlchemyError as error:
        return _page(action, None, None, _store_failure(error))
    return _page(action, None, done, None)
