"""Which saga store a process uses, as its messages and its workers name it.

Two deployments may share a broker's queue by mistake (a staging worker on production's
vhost). Each message names the store its run lives in, so a worker whose store lacks the
run can tell another store's run (handed back for that store's workers) from a stale
message of its own store (dropped). The name is a short hash of where the store is
(backend, host, port, database): no user or password ever goes into a message.
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import quote_plus

from sqlalchemy import select
from sqlalchemy.engine import make_url

from celery_saga.store.database import Database
from celery_saga.store.tables import executions


def store_identity(url: str) -> str:
    """Eight hex characters naming the store at ``url``; the same for every driver, user and
    query string of it. Two spellings of one server (a host name and its address) give two
    names: a worker then reads its store before it hands a message back, never drops one."""
    parsed = make_url(url)
    where = f"{parsed.get_backend_name()}://{parsed.host or ''}:{parsed.port or ''}/"
    where += parsed.database or ""
    return hashlib.sha256(where.encode()).hexdigest()[:8]


#: Query parameters that hold a secret (libpq's ``password`` and ``sslpassword``, a token).
_SECRET_PARAMETER = re.compile("pass|secret|token", re.IGNORECASE)


def shown_store(url: str) -> str:
    """The store's URL as logs, hints and printed settings show it: without its password,
    whether in the URL's user part or in a query parameter (``?password=...``)."""
    parsed = make_url(url)
    shown = parsed.set(query={}).render_as_string(hide_password=True)
    pairs = [
        f"{quote_plus(name)}={'***' if _SECRET_PARAMETER.search(name) else quote_plus(value)}"
        for name in sorted(parsed.query)
        for value in _listed(parsed.query[name])
    ]
    return shown + ("?" + "&".join(pairs) if pairs else "")


def _listed(value: str | tuple[str, ...]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else value


def holds_run(db: Database, execution_id: str) -> bool:
    """Whether this store holds the run ``execution_id`` (one primary-key read)."""
    return bool(db.read(select(executions.c.id).where(executions.c.id == execution_id)))
