"""CSRF tokens: the user's name signed with the view's secret and stamped with the time.

A browser sends basic-auth credentials with any form another site makes it post, but that
site cannot read a page of this view, so it cannot know a token; one signed for another
user, or older than ``MAX_AGE``, is refused as well. No session or cookie is needed."""

from __future__ import annotations

from itsdangerous import BadSignature, URLSafeTimedSerializer

#: Seconds a page's forms stay valid.
MAX_AGE = 8 * 3600
_SALT = "celery-saga-web-csrf"


def _serializer(secret: str) -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(secret, salt=_SALT)


def token_for(user: str, secret: str) -> str:
    return _serializer(secret).dumps(user)


def valid(token: str | None, user: str, secret: str) -> bool:
    """Whether ``token`` was signed by this view for ``user`` within ``MAX_AGE``."""
    if not token:
        return False
    try:
        signed = _serializer(secret).loads(token, max_age=MAX_AGE)
    except BadSignature:  # SignatureExpired is one too
        return False
    return bool(signed == user)
