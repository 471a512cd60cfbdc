"""CSRF tokens: one per form, naming the user, the action and the run it acts on, signed
with the view's secret and stamped with the time the page drew it.

A browser sends basic-auth credentials with any form another site makes it post, but that
site cannot read a page of this view, so it cannot know a token. A token is good for the
form it was drawn for only: the same user, the same action on the same run, for
``MAX_AGE`` seconds. One read from a page (a proxy's log, a shared screenshot) neither
resumes nor cancels another run, nor takes another action on this one, and is worthless a
few minutes later. No session or cookie is needed."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from itsdangerous import BadSignature, URLSafeSerializer

#: Seconds a page's forms stay valid: long enough to read the page and decide.
MAX_AGE = 15 * 60
_SALT = "celery-saga-web-form"
_MISSING = "missing or invalid CSRF token\n"
_ELSEWHERE = "this CSRF token is for another form (user, action or run): reload the run's page\n"
_EXPIRED = (
    f"this form has expired (its CSRF token lasts {MAX_AGE // 60} minutes): reload the page\n"
)


@dataclass(frozen=True)
class Forms:
    """The forms of ``user``, signed with the view's ``secret``."""

    secret: str = field(repr=False)
    user: str

    def _serializer(self) -> URLSafeSerializer:
        return URLSafeSerializer(self.secret, salt=_SALT)

    def token(self, action: str, execution_id: str, now: datetime) -> str:
        """The token of the form that takes ``action`` on run ``execution_id``."""
        return self._serializer().dumps([self.user, action, execution_id, now.timestamp()])

    def refusal(
        self, token: str | None, action: str, execution_id: str, now: datetime
    ) -> str | None:
        """Why a post of ``action`` on ``execution_id`` with ``token`` is refused at ``now``
        (the text of the 403), or None when the token is this form's and still fresh."""
        try:
            signed = self._serializer().loads(token) if token else None
        except BadSignature:
            signed = None
        if not isinstance(signed, list) or len(signed) != 4:
            return _MISSING
        user, signed_action, signed_run, issued = signed
        if [user, signed_action, signed_run] != [self.user, action, execution_id]:
            return _ELSEWHERE
        if not isinstance(issued, (int, float)) or now.timestamp() - issued > MAX_AGE:
            return _EXPIRED
        return None
