"""A store URL that cannot work as given: say why and what to change, in one line.

A server that answered and refused (no such database, a user it does not accept), a driver
the URL names but nobody installed, a SQLite file that cannot be opened: no retry mends any
of these, so they are not treated as an outage (``transient.is_transient``) and the public
calls raise ``StoreConfigurationError`` at once with the fix in the message. They raise it
on its own (``from None``): the message already says what the server or driver said, and
the driver's error with its frames, a hundred lines above it in a script's or a task's
traceback, is logged at DEBUG instead (``quieted``).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sqlalchemy import exc
from sqlalchemy.engine import URL, make_url

from celery_saga.errors import StoreConfigurationError
from celery_saga.store import drivers

logger = logging.getLogger("celery_saga")

#: What libpq-based drivers report when the server refused the connection (its FATAL
#: message, or libpq's own for a password the server asked for and the URL lacks). Anything
#: else at connect time (starting up, shutting down, too many clients) stays an outage.
_PG_UNKNOWN_DATABASE = re.compile(r'database "[^"]*" does not exist')
_PG_REFUSED_USER = re.compile(
    r'role "[^"]*" does not exist|authentication failed for user|no pg_hba\.conf entry'
    r"|no password supplied|permission denied for database"
)
#: MySQL/MariaDB server error codes: unknown database; access denied to a database, with a
#: password, without one.
_MYSQL_UNKNOWN_DATABASE = 1049
_MYSQL_REFUSED_USER = frozenset({1044, 1045, 1698})
#: SQLite cannot open or create the file: its path is wrong or not writable.
_SQLITE_CANNOT_OPEN = ("unable to open database file", "readonly database")

#: (dialect, driver) of a URL that asks for a driver no extra installs -> the URL to write.
_OTHER_SCHEME = {
    ("postgresql", "psycopg2"): "postgresql+psycopg",
    ("mysql", "mysqldb"): "mysql+pymysql",
    ("mariadb", "mysqldb"): "mariadb+pymysql",
}
#: Driver -> (the extra that installs it, the driver's name).
_EXTRAS = {"psycopg": ("postgres", "psycopg 3"), "pymysql": ("mysql", "PyMySQL")}
_SERVERS = {
    "postgresql": ("PostgreSQL", 5432),
    "mysql": ("MySQL/MariaDB", 3306),
    "mariadb": ("MariaDB", 3306),
}


@dataclass(frozen=True)
class Refusal:
    """What a store error says was refused, in the server's or driver's own words."""

    kind: Literal["database", "user", "file"]
    reason: str


def _line_of(text: str, match: re.Match[str]) -> str:
    start = text.rfind("\n", 0, match.start()) + 1
    end = text.find("\n", match.end())
    line = text[start : end if end >= 0 else len(text)]
    return line.split("FATAL:", 1)[-1].strip()


def refusal(error: BaseException) -> Refusal | None:
    """The refusal ``error`` reports, or None when it is anything else (an outage, a bad
    statement). Only connection-level errors qualify: a query never reports these."""
    if not isinstance(error, (exc.OperationalError, exc.InterfaceError)):
        return None
    origin = error.orig
    if origin is None:
        return None
    if drivers.raised_by_sqlite3(origin):
        text = str(origin)
        return Refusal("file", text) if any(s in text for s in _SQLITE_CANNOT_OPEN) else None
    code = origin.args[0] if origin.args else None
    if isinstance(code, int):  # MySQL drivers: (code, message)
        message = str(origin.args[1]) if len(origin.args) > 1 else str(origin)
        if code == _MYSQL_UNKNOWN_DATABASE:
            return Refusal("database", message)
        return Refusal("user", message) if code in _MYSQL_REFUSED_USER else None
    text = str(origin)
    found = _PG_UNKNOWN_DATABASE.search(text)
    if found:
        return Refusal("database", _line_of(text, found))
    found = _PG_REFUSED_USER.search(text)
    return Refusal("user", _line_of(text, found)) if found else None


def _quoted(name: str, dialect: str) -> str:
    if dialect == "postgresql":
        simple = re.fullmatch(r"[a-z_][a-z0-9_]*", name)
        return name if simple else '"' + name.replace('"', '""') + '"'
    simple = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]*", name)
    return name if simple else "`" + name.replace("`", "``") + "`"


def _sqlite_cause(url: URL, reason: str) -> tuple[str, str]:
    """Why the SQLite file cannot be opened, and what to do about it."""
    path = Path(os.path.abspath(url.database or ""))
    parent = path.parent
    if path.is_dir():
        return f"the SQLite store {path} is a directory", "name a file in it"
    if not parent.exists():
        cause = f"the directory of the SQLite store {path} does not exist"
        return cause, f"create it (mkdir -p {parent})"
    if not parent.is_dir():
        return f"{parent}, the SQLite store's directory, is not a directory", "name another"
    if not os.access(parent, os.W_OK | os.X_OK):
        cause = f"the directory {parent} of the SQLite store is not writable by this process"
        # SQLite writes its -wal and -shm files next to the database.
        return cause, "make it writable, or choose another directory"
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        cause = f"the SQLite store {path} is not readable and writable by this process"
        return cause, "fix its permissions"
    return f"the SQLite store {path} cannot be opened ({reason})", "check the path"


def configuration_error(error: BaseException, url: str) -> StoreConfigurationError | None:
    """The one-line error for a store that refused ``url`` (see ``refusal``), else None."""
    found = refusal(error)
    if found is None:
        return None
    parsed = make_url(url)
    shown = parsed.render_as_string(hide_password=True)
    if found.kind == "file":
        cause, fix = _sqlite_cause(parsed, found.reason)
        return StoreConfigurationError(f"{cause}: {fix}, or change the store URL ({shown})")
    dialect = parsed.get_backend_name()
    server, default_port = _SERVERS.get(dialect, (dialect, None))
    where = f"the {server} server at {parsed.host or 'localhost'}:{parsed.port or default_port}"
    database = parsed.database or ""
    if found.kind == "database":
        return StoreConfigurationError(
            f"{where} has no database {database!r} (the store URL {shown}): create it once "
            f"(CREATE DATABASE {_quoted(database, dialect)}) or point the URL at one that exists"
        )
    who = f"user {parsed.username!r}" if parsed.username else "the connection"
    return StoreConfigurationError(
        f"{where} refused {who} for database {database!r} ({found.reason}): check the user "
        f"and password in the store URL {shown}"
    )


def quieted(refused: StoreConfigurationError, error: BaseException) -> StoreConfigurationError:
    """``refused``, to be raised ``from None``, once ``error`` (what the store or driver
    raised) is logged at DEBUG with its traceback (tests/test_store_url_errors.py)."""
    logger.debug("the store error behind %r", str(refused), exc_info=error)
    return refused


def driver_missing(parsed: URL, error: ImportError) -> StoreConfigurationError:
    """The one-line error for a URL whose driver cannot be imported: what to install, or
    which URL to write so that the driver an extra installs is used."""
    shown = parsed.render_as_string(hide_password=True)
    dialect, driver = parsed.get_backend_name(), parsed.get_driver_name()
    cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    other = _OTHER_SCHEME.get((dialect, driver))
    wanted = other.split("+")[1] if other else driver
    if wanted in _EXTRAS:
        extra, name = _EXTRAS[wanted]
        rewrite = f"write it as {other}://... and " if other else ""
        return StoreConfigurationError(
            f"the store URL {shown} asks for the {driver} driver, which cannot be imported "
            f"({cause}): {rewrite}install the {extra} extra, which installs {name} (from the "
            f'clone: pip install ".[{extra}]")'
        )
    return StoreConfigurationError(
        f"the store URL {shown} asks for the {driver} driver, which cannot be imported ({cause})"
    )


def parse(url: str) -> URL:
    """``url`` as SQLAlchemy reads it; a string it cannot read is a one-line error (not
    echoed: it may hold a password)."""
    try:
        return make_url(url)
    except exc.ArgumentError:
        raise StoreConfigurationError(
            "the store URL cannot be read as a database URL; write it as "
            "dialect+driver://user:password@host:port/database (e.g. "
            "postgresql+psycopg://..., mysql+pymysql://..., sqlite:///path)"
        ) from None


def unknown_dialect(parsed: URL) -> StoreConfigurationError:
    """The one-line error for a URL whose scheme SQLAlchemy has no dialect for."""
    return StoreConfigurationError(
        f"the store URL {parsed.render_as_string(hide_password=True)} names "
        f"{parsed.drivername!r}, which SQLAlchemy does not know: write sqlite:///path, "
        "postgresql+psycopg://... or mysql+pymysql://..."
    )
