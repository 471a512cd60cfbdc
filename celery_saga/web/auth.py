"""Who is asking: the user an ``Authorization`` header proves, checked in constant time."""

from __future__ import annotations

import base64
import binascii
import hmac

from celery_saga.web.settings import Credentials

#: The user named in the history for a request that carried the bearer token.
TOKEN_USER = "token"
#: The user of a view started without authentication (read-only: see ``settings.refusal``).
ANONYMOUS = "anonymous"


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def _basic(encoded: str) -> tuple[str, str] | None:
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, colon, password = decoded.partition(":")
    return (user, password) if colon else None


def authenticated_user(header: str | None, credentials: Credentials) -> str | None:
    """The user ``header`` (an ``Authorization`` value) proves, None when it proves none;
    ``ANONYMOUS`` when the view asks for no credentials."""
    if not credentials.required:
        return ANONYMOUS
    scheme, _, value = (header or "").partition(" ")
    if scheme.lower() == "bearer" and credentials.token is not None:
        return TOKEN_USER if _same(value.strip(), credentials.token) else None
    if scheme.lower() == "basic" and credentials.user is not None:
        pair = _basic(value)
        if pair is None or credentials.password is None:
            return None
        # Both compared, always: how long it takes says nothing of which one was wrong.
        user_ok = _same(pair[0], credentials.user)
        password_ok = _same(pair[1], credentials.password)
        return credentials.user if user_ok and password_ok else None
    return None
