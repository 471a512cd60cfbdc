"""A store URL that cannot work fails at once with one line naming the cause and the fix: a
database the server does not have, a user it refuses, a SQLite path that cannot be created,
a driver that is not installed. A server that cannot be reached is still retried."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from celery import Celery
from click.testing import CliRunner
from sqlalchemy import exc

from celery_saga import Saga, SagaEngine, StoreConfigurationError, StoreUnavailableError
from celery_saga.cli import saga
from celery_saga.store.url_errors import configuration_error
from tests.conftest import _MARIADB_SHARED, PG_ADMIN, ROOT, require_services, unconsumed_app

_CANNOT_OPEN = "unable to open database file"  # what sqlite3 says, whatever the cause
#: Well under the default retry budget (15 s) that an outage would be retried for.
AT_ONCE = 5.0
_SERVERS = {"postgres": (PG_ADMIN, 5432), "mariadb": (_MARIADB_SHARED, 3306)}


def _url(server: str, *, database: str | None = None, user: str | None = None) -> str:
    base, port = _SERVERS[server]
    require_services(port)
    scheme, rest = base.split("://", 1)
    login, location = rest.split("@", 1)
    host, default_database = location.rsplit("/", 1)
    return f"{scheme}://{user or login}@{host}/{database or default_database}"


def _engine(url: str, budget: float | None = None) -> SagaEngine:
    app = unconsumed_app("url-errors")
    if budget is not None:
        app.conf.saga_store_retry_budget = budget
    engine = SagaEngine(app, store_url=url)
    engine.register(Saga("order").step("reserve", lambda ctx: 1))
    return engine


def _refused(engine: SagaEngine) -> str:
    began = time.monotonic()
    with pytest.raises(StoreConfigurationError) as raised:
        engine.start("order", {"id": 1})
    assert time.monotonic() - began < AT_ONCE, "retried as if the server were down"
    message = str(raised.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("server", ["postgres", "mariadb"])
def test_a_database_the_server_does_not_have_fails_at_once_naming_it(server: str) -> None:
    name = f"no_such_store_{uuid.uuid4().hex[:8]}"
    message = _refused(_engine(_url(server, database=name)))
    assert f"has no database '{name}'" in message, message
    assert f"CREATE DATABASE {name}" in message, message


@pytest.mark.parametrize("server", ["postgres", "mariadb"])
def test_a_user_the_server_refuses_fails_at_once_without_showing_the_password(
    server: str,
) -> None:
    user = f"no_such_user_{uuid.uuid4().hex[:8]}"
    message = _refused(_engine(_url(server, user=f"{user}:s3cret-pw")))
    assert f"refused user '{user}'" in message, message
    assert "check the user and password" in message and "s3cret-pw" not in message, message


def test_the_db_command_names_a_missing_database_in_one_line() -> None:
    name = f"no_such_store_{uuid.uuid4().hex[:8]}"
    app = unconsumed_app("url-errors-cli")  # no engine: the command reads saga_store_url
    app.conf.saga_store_url = _url("postgres", database=name)
    result = CliRunner().invoke(saga, ["db", "current"], obj=SimpleNamespace(app=app))
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert f"has no database '{name}'" in lines[0], lines[0]


def test_a_server_that_cannot_be_reached_is_still_retried_for_the_budget() -> None:
    engine = _engine("postgresql+psycopg://postgres@127.0.0.1:1/sagas", budget=1.0)
    began = time.monotonic()
    with pytest.raises(StoreUnavailableError, match="could not be reached within 1 s"):
        engine.start("order", {"id": 1})
    assert time.monotonic() - began >= 0.5  # tried again and again, not refused at once


def test_a_sqlite_store_whose_directory_is_missing_names_it_and_creates_nothing(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "missing" / "deeper"
    message = _refused(_engine(f"sqlite:///{missing}/store.sqlite3"))
    assert f"the directory of the SQLite store {missing}/store.sqlite3 does not exist" in message
    assert not (tmp_path / "missing").exists()
    assert "is a directory" in _refused(_engine(f"sqlite:///{tmp_path}"))


def test_a_sqlite_directory_this_process_cannot_write_is_named(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes to any directory (the diagnosis is tested below)")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        message = _refused(_engine(f"sqlite:///{locked}/store.sqlite3"))
    finally:
        locked.chmod(0o700)
    assert f"the directory {locked} of the SQLite store is not writable" in message, message


def test_the_sqlite_diagnosis_names_a_directory_it_may_not_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Permissions as an unprivileged user meets them, whoever runs the suite.
    locked = tmp_path / "locked"
    locked.mkdir()
    allowed = os.access
    monkeypatch.setattr(
        os, "access", lambda path, mode: Path(path) != locked and allowed(path, mode)
    )
    error = exc.OperationalError("connect", {}, sqlite3.OperationalError(_CANNOT_OPEN))
    found = configuration_error(error, f"sqlite:///{locked}/store.sqlite3")
    assert found is not None
    assert str(found).startswith(f"the directory {locked} of the SQLite store is not writable")
    assert "make it writable" in str(found)
    assert (
        configuration_error(
            exc.OperationalError("x", {}, sqlite3.OperationalError("busy")), "sqlite://"
        )
        is None
    )


# The drivers are made unimportable the way a virtualenv without the extra would have them.
_WITHOUT_DRIVERS = """
import sys
for name in ("psycopg", "psycopg2", "pymysql", "MySQLdb"):
    sys.modules[name] = None
from celery import Celery
from celery_saga import SagaEngine, StoreConfigurationError
for url in sys.argv[1:]:
    try:
        SagaEngine(Celery("shop", set_as_current=False), store_url=url)
    except StoreConfigurationError as error:
        print(error)
    else:
        print("accepted")
"""


def test_a_url_whose_driver_is_missing_says_which_extra_installs_it() -> None:
    extra = 'install the {0} extra, which installs {1} (from the clone: pip install ".[{0}]")'
    halted = "which cannot be imported (import of {} halted; None in sys.modules)"
    expected = {
        "mysql+pymysql://root:pw@db/shop": f"{halted.format('pymysql')}: "
        + extra.format("mysql", "PyMySQL"),
        "mysql://root@db/shop": f"{halted.format('MySQLdb')}: write it as mysql+pymysql://... "
        + f"and {extra.format('mysql', 'PyMySQL')}",
        "postgresql+psycopg://app@db/shop": f"{halted.format('psycopg')}: "
        + extra.format("postgres", "psycopg 3"),
        # SQLAlchemy 2.0 reads postgresql:// as psycopg2 (then: write postgresql+psycopg://),
        # 2.1 as psycopg: the postgres extra installs it either way.
        "postgresql://app@db/shop": extra.format("postgres", "psycopg 3"),
        "postgres://app@db/shop": "names 'postgres', which SQLAlchemy does not know",
        "no url at all": "cannot be read as a database URL",
    }
    found = subprocess.run(
        [sys.executable, "-c", _WITHOUT_DRIVERS, *expected],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert found.returncode == 0, found.stderr
    lines = found.stdout.splitlines()
    assert len(lines) == len(expected), found.stdout
    for line, (url, message) in zip(lines, expected.items(), strict=True):
        assert message in line, (url, line)
    assert ":pw@" not in found.stdout and "root:***@db" in lines[0]


# -- what each entry point shows of a refused URL: the one line, not the driver's traceback

_STARTS_A_RUN = """
import logging, sys
from celery import Celery
from celery_saga import Saga, SagaEngine
if sys.argv[2:] == ["debug"]:
    logging.basicConfig(level=logging.DEBUG)
engine = SagaEngine(Celery("shop", set_as_current=False), store_url=sys.argv[1])
engine.register(Saga("order").step("reserve", lambda ctx: 1))
engine.start("order", {"id": 1})
"""


def _python(*args: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_script_that_meets_a_refused_url_shows_its_own_frames_and_the_one_line(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/missing/store.sqlite3"
    done = _python("-c", _STARTS_A_RUN, url)
    assert done.returncode == 1
    said = done.stderr.splitlines()
    assert said[-1].startswith("celery_saga.errors.StoreConfigurationError: the directory of")
    # The driver's and SQLAlchemy's errors, with their frames, are not printed before it.
    assert "sqlite3.OperationalError" not in done.stderr, done.stderr
    assert "The above exception" not in done.stderr and len(said) < 15, done.stderr
    # At DEBUG the store's own error is logged with its traceback, for whoever needs it.
    debug = _python("-c", _STARTS_A_RUN, url, "debug")
    assert "sqlite3.OperationalError: unable to open database file" in debug.stderr


def test_the_example_project_says_a_refused_url_in_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/missing/x.sqlite3"
    done = _python("-m", "example_project", cwd=tmp_path, SAGA_STORE_URL=url)
    assert done.returncode == 1
    assert (done.stdout + done.stderr).splitlines() == [
        f"error: the directory of the SQLite store {tmp_path}/missing/x.sqlite3 does not exist: "
        f"create it (mkdir -p {tmp_path}/missing), or change the store URL "
        f"(sqlite:///{tmp_path}/missing/x.sqlite3)"
    ]


_REFUSING_APP = """
import os
from celery import Celery
from celery_saga import SagaEngine
app = Celery("refusing", broker=os.environ["TEST_BROKER"])
app.conf.update(
    task_default_queue=os.environ["TEST_QUEUE"],  # the worker's own recovery sweep too
    saga_store_url=os.environ["TEST_STORE"],
    broker_connection_retry_on_startup=True,
)
engine = SagaEngine(app)
"""


def test_a_worker_whose_store_refuses_its_url_logs_one_line_per_message_and_no_traceback(
    tmp_path: Path,
) -> None:
    require_services(5672)
    queue = f"url-errors-{uuid.uuid4().hex[:8]}"
    broker = os.environ.get("SAGA_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672//")
    (tmp_path / "refusing.py").write_text(_REFUSING_APP)
    env = {
        **os.environ,
        "PYTHONPATH": f"{tmp_path}:{ROOT}",
        "TEST_BROKER": broker,
        "TEST_QUEUE": queue,
        "TEST_STORE": f"sqlite:///{tmp_path}/missing/store.sqlite3",
    }
    log = tmp_path / "worker.log"
    command = [sys.executable, "-m", "celery", "-A", "refusing", "worker", "-c", "1"]
    command += ["-n", f"{queue}@%h", "--without-gossip", "--without-mingle", "-l", "INFO"]
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            command,
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    app = Celery("url-errors-sender", broker=broker, set_as_current=False)
    node = app.send_task("celery_saga.node", args=("run-1", "order", 0, 0, 0, 1), queue=queue)
    app.send_task("celery_saga.fire_timers", queue=queue)
    # The worker's start, the node's message, the timer sweep, the recovery sweep the
    # worker sends itself at start: one line each.
    said: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while len(said) < 4 and time.monotonic() < deadline:
            time.sleep(0.5)
            said = _lines_naming(log, "does not exist: create it (mkdir -p")
        time.sleep(1.0)  # anything more it would say about them
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text[-6000:]
    said = _lines_naming(log, "does not exist: create it (mkdir -p")
    assert len(said) == 4, text[-6000:]
    assert any(f"celery_saga.node[{node.id}] raised expected" in line for line in said), said
    assert [line for line in said if "sweep skipped" in line and "ERROR" in line], said


def _lines_naming(log: Path, words: str) -> list[str]:
    return [line for line in log.read_text(errors="replace").splitlines() if words in line]
