"""What the web view is started with, and the one decision taken before it serves: whether
it may start at all."""

from __future__ import annotations

from dataclasses import dataclass

from celery_saga.web.hosts import name_problem


@dataclass(frozen=True)
class Credentials:
    """Who may open the view: HTTP basic auth (``user`` and ``password``) and/or a bearer
    ``token`` (the user it names in the history is ``token``)."""

    user: str | None = None
    password: str | None = None
    token: str | None = None

    @property
    def required(self) -> bool:
        return self.user is not None or self.token is not None


@dataclass(frozen=True)
class WebSettings:
    """``actions``: the signal, resume, abandon and cancel buttons are shown and served
    (off by default). ``secret``: signs the CSRF tokens (random per start when None, so a
    restart invalidates the forms a browser still has open). ``page_size``: runs per page.
    ``trusted_hosts``: the names, besides ``localhost``, ``127.0.0.1`` and ``[::1]``, that a
    request's ``Host`` may give (the address the view listens on, a proxy's host name); any
    other gets ``400``."""

    credentials: Credentials = Credentials()
    actions: bool = False
    secret: str | None = None
    page_size: int = 50
    trusted_hosts: tuple[str, ...] = ()


def parse_basic_auth(value: str) -> tuple[str, str]:
    """``user:password`` as given to ``--basic-auth``; the password may hold colons."""
    user, colon, password = value.partition(":")
    if not colon or not user or not password:
        raise ValueError("--basic-auth takes user:password, both non-empty")
    return user, password


def refusal(settings: WebSettings) -> str | None:
    """Why the view must not start with ``settings``, or None: actions change runs, so they
    are never served to whoever can reach the port; a trusted host must be a host name."""
    if settings.actions and not settings.credentials.required:
        return (
            "--enable-actions needs authentication: give --basic-auth user:password and/or --token"
        )
    return next(filter(None, map(name_problem, settings.trusted_hosts)), None)
