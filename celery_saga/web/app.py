"""The web view's Flask application: which names it answers (``hosts``), who may ask
(``auth``), which forms are genuine (``csrf``), and the headers that keep the pages to
themselves; the pages are in ``pages``."""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Any

from flask import Flask, Response, g, request

from celery_saga.inspect import vocabulary
from celery_saga.runtime.clock import get_clock
from celery_saga.web import auth, bulk_pages, csrf, hosts
from celery_saga.web.pages import pages
from celery_saga.web.settings import WebSettings, refusal
from celery_saga.worker.engine import SagaEngine

#: Nothing is loaded from elsewhere, nothing runs but the page, no other site frames it.
_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_UNTRUSTED_HOST = (
    "the Host header names a host this view does not serve"
    " (a proxy's name is added with --trusted-host)\n"
)


def _challenge(settings: WebSettings) -> Response:
    schemes = []
    if settings.credentials.user is not None:
        schemes.append('Basic realm="celery saga", charset="UTF-8"')
    if settings.credentials.token is not None:
        schemes.append('Bearer realm="celery saga"')
    response = Response("authentication required\n", 401, mimetype="text/plain")
    for scheme in schemes:
        response.headers.add("WWW-Authenticate", scheme)
    return response


def create_app(engine: SagaEngine, settings: WebSettings) -> Flask:
    """The view over ``engine``'s store; raises ``ValueError`` when ``settings`` may not
    serve (actions without authentication)."""
    refused = refusal(settings)
    if refused is not None:
        raise ValueError(refused)
    app = Flask(__name__)
    app.config["SAGA_ENGINE"] = engine
    app.config["SAGA_WEB"] = settings
    secret = settings.secret or secrets.token_urlsafe(32)
    trusted = hosts.trusted_names(settings.trusted_hosts)
    # Routing would redirect ``/runs/a//b`` to ``/runs/a/b``: to another run (a POST too).
    app.url_map.merge_slashes = False

    @app.before_request
    def check_host() -> Response | None:
        """Before credentials: a page that rebound its name to this view gets nothing."""
        if hosts.is_trusted(request.headers.get("Host"), trusted):
            return None
        return Response(_UNTRUSTED_HOST, 400, mimetype="text/plain")

    @app.before_request
    def authenticate() -> Response | None:
        user = auth.authenticated_user(request.headers.get("Authorization"), settings.credentials)
        if user is None:
            return _challenge(settings)
        g.user = user
        g.forms = csrf.Forms(secret, user)
        # A post no route takes does nothing: it gets its 404 (or 405), not a token check.
        if request.method == "POST" and request.routing_exception is None:
            if not settings.actions:
                return Response("actions are off in this view\n", 403, mimetype="text/plain")
            # The form's action and run are the URL's: a token is good for that form only.
            target = request.view_args or {}
            # A bulk move's form has no run: its token is for the terms it was shown with.
            runs = target.get("execution_id", bulk_pages.form_terms(request.form))
            refused = g.forms.refusal(
                request.form.get("csrf_token"),
                str(target.get("action", "")),
                str(runs),
                get_clock().now(),
            )
            if refused is not None:
                return Response(refused, 403, mimetype="text/plain")
        return None

    @app.after_request
    def harden(response: Response) -> Response:
        response.headers["Content-Security-Policy"] = _POLICY
        response.headers["X-Frame-Options"] = "DENY"  # frame-ancestors, for older browsers
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["Cache-Control"] = "no-store"
        return response

    @app.context_processor
    def shared() -> dict[str, Any]:
        # Every page says so when its reads come from a replica behind the store.
        lag = engine.inspect().lag()
        staleness = lag.describe() if lag.worth_saying else None
        return {"actions_enabled": settings.actions, "user": g.get("user"), "staleness": staleness}

    @app.template_filter("when")
    def when(value: datetime | None) -> str:
        """A time to the millisecond, as the timeline's offsets are."""
        return "" if value is None else value.isoformat()[:23].replace("T", " ")

    app.template_filter("status_class")(vocabulary.css_class)

    app.register_blueprint(pages)
    return app
