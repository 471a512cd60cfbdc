"""Backends for the behaviour suite.

``sqlite``: SQLite file + ``memory://`` broker + an in-process worker (threads pool).
``postgres-rabbitmq`` / ``postgres-redis``: PostgreSQL store and two real ``celery worker``
subprocesses (prefork, concurrency 2) that publish every message twice, so every behaviour
test on these backends also runs under duplicate delivery to racing workers.

Without the services these backends are skipped, unless SAGA_REQUIRE_SERVICES=1 (CI), in
which case they fail.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

from celery_saga.store.tables import metadata as saga_metadata
from celery_saga.worker.embedded import embedded_worker
from tests.sagaapp import TestApp

# The package's fixtures (saga_kit, saga_engine...): opt-in, as for the package's users.
pytest_plugins = ["celery_saga.testing.plugin"]

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN = os.environ.get(
    "SAGA_TEST_PG_ADMIN", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
#: The pytest-xdist worker this process is ("gw0", ...; empty when the suite runs in one
#: process): each has databases of its own, since the harness empties its database.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_OWN = f"_{XDIST_WORKER}" if XDIST_WORKER else ""
#: 0 for the first xdist worker (or no xdist): to pick a Redis database of its own.
XDIST_INDEX = int(XDIST_WORKER.removeprefix("gw") or 0)
# Separate names let two checkouts run the suite at once without emptying each other's rows.
PG_DATABASE = os.environ.get("SAGA_TEST_PG_DATABASE", "celery_saga_tests") + _OWN
BROKERS = {
    "postgres-rabbitmq": os.environ.get("SAGA_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672//"),
    "postgres-redis": os.environ.get("SAGA_TEST_REDIS", "redis://127.0.0.1:6379/0"),
}
PORTS = {"postgres": 5432, "postgres-rabbitmq": 5672, "postgres-redis": 6379}


@pytest.fixture(autouse=True, scope="module")
def _idle_store_connections_closed() -> Iterator[None]:
    """After each module, the pooled connections its engines left idle are closed (an
    engine still in use opens new ones when it needs them): the test processes together
    must stay under PostgreSQL's 100 connections, whatever the number of modules."""
    yield
    for engine in [o for o in gc.get_objects() if isinstance(o, Engine)]:
        engine.dispose()


@pytest.fixture
def spans() -> Iterator[Any]:
    """An OpenTelemetry SDK provider for the test, exporting to memory (``tracing_kit``)."""
    from tests.tracing_kit import sdk_provider

    with sdk_provider() as memory:
        yield memory


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def require_services(*ports: int) -> None:
    missing = [p for p in ports if not _listening(p)]
    if not missing:
        return
    message = f"services not listening on 127.0.0.1 ports {missing}"
    if os.environ.get("SAGA_REQUIRE_SERVICES") == "1":
        pytest.fail(message + " and SAGA_REQUIRE_SERVICES=1")
    pytest.skip(message)


_PG_FRESH: list[bool] = []


def _test_database_url() -> str:
    """This process's PostgreSQL test database, made anew once per session: one a checkout
    of another revision left behind (its schema stamped with a migration this one does not
    know) must not fail the suite."""
    if not _PG_FRESH:
        admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.execute(text(f"DROP DATABASE IF EXISTS {PG_DATABASE} WITH (FORCE)"))
            connection.execute(text(f"CREATE DATABASE {PG_DATABASE}"))
        admin.dispose()
        _PG_FRESH.append(True)
    return PG_ADMIN.rsplit("/", 1)[0] + "/" + PG_DATABASE


def fresh_pg_database(suffix: str) -> str:
    """An empty PostgreSQL database of this process's own (dropped first if it exists), for
    a test whose rows no other test may read (payloads sealed with the test's own keys)."""
    name = f"{PG_DATABASE}_{suffix}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        connection.execute(text(f"CREATE DATABASE {name}"))
    admin.dispose()
    return PG_ADMIN.rsplit("/", 1)[0] + "/" + name


@dataclass
class Harness:
    name: str
    test_app: TestApp
    in_process: bool
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    @property
    def engine(self) -> Any:
        return self.test_app.engine

    def start(self, saga: str, data: dict[str, Any] | None = None) -> Any:
        return self.engine.start(saga, data or {})

    def process_env(self, **extra: str) -> dict[str, str]:
        """The environment of a process of this rig's app (``tests.sagaapp``): a CLI, Flower."""
        conf = self.test_app.app.conf
        return {
            **os.environ,
            "SAGA_TEST_BROKER": conf.broker_url,
            "SAGA_TEST_STORE": conf.saga_store_url,
            "SAGA_TEST_QUEUE": conf.task_default_queue,
            "PYTHONPATH": str(ROOT),
            **extra,
        }

    def worker_logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-4000:] for p in self.logs)


def _spawn_workers(
    env: dict[str, str],
    queue: str,
    logdir: Path,
    count: int,
    events: bool = True,
    prefix: str = "w",
    concurrency: int = 2,
    app: str = "tests.sagaapp:app",
) -> tuple[list[subprocess.Popen[bytes]], list[Path]]:
    workers, logs = [], []
    for index in range(count):
        log = logdir / f"worker{index}.log"
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            app,
            "worker",
            "-P",
            "prefork",
            "-c",
            str(concurrency),
            "--prefetch-multiplier",
            "1",
            "-Q",
            queue,
            "-n",
            f"{prefix}{index}-{queue}@%h",
            "--without-gossip",
            "--without-mingle",
            "-l",
            "INFO",
            *(["-E"] if events else []),
        ]
        handle = open(log, "wb")  # noqa: SIM115 - closed with the process
        workers.append(
            subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        logs.append(log)
    return workers, logs


def spawn_beat(env: dict[str, str], folder: Path) -> subprocess.Popen[bytes]:
    """A real ``celery beat`` for the test app, sending the sweeps on their schedule."""
    log = open(folder / "beat.log", "wb")  # noqa: SIM115 - closed with the process
    command = [sys.executable, "-m", "celery", "-A", "tests.sagaapp:app", "beat"]
    command += ["-s", str(folder / "beat-schedule"), "--max-interval", "1", "-l", "INFO"]
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def _wait_ready(test_app: TestApp, count: int, workers: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(w.poll() is not None for w in workers):
            raise RuntimeError("a test worker exited during start-up")
        # Only this app's own workers count: other tests' workers share the broker.
        queue = test_app.app.conf.task_default_queue
        replies = test_app.app.control.ping(timeout=1.0) or []
        if sum(queue in name for reply in replies for name in reply) >= count:
            return
    raise RuntimeError("test workers did not answer ping within 60 s")


def stop_workers(workers: list[subprocess.Popen[bytes]]) -> None:
    for worker in workers:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=5)


def client_app(env: dict[str, str], broker: str, store: str, queue: str) -> TestApp:
    """The test process's own app, built under a rig's ``SAGA_TEST_*`` settings (lease,
    sweeps...) as its worker processes get them, without leaving them in this process."""
    saved = dict(os.environ)
    os.environ.update({k: v for k, v in env.items() if k.startswith("SAGA_TEST_")})
    try:
        return TestApp(broker, store, queue)
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session", params=["sqlite", "postgres-rabbitmq", "postgres-redis"])
def harness(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    name: str = request.param
    tmp = tmp_path_factory.mktemp(name)
    queue = f"saga-test-{uuid.uuid4().hex[:10]}"
    if name == "sqlite":
        test_app = TestApp("memory://localhost/", f"sqlite:///{tmp}/store.sqlite3", queue)
        test_app.engine.ensure_schema()
        with embedded_worker(test_app.app, concurrency=4):
            yield Harness(name, test_app, in_process=True)
        return
    require_services(PORTS["postgres"], PORTS[name])
    store = _test_database_url()
    test_app = TestApp(BROKERS[name], store, queue, reset=True)
    test_app.engine.ensure_schema()
    with test_app.engine.db.transaction() as connection:
        connection.execute(text(f"TRUNCATE {', '.join(saga_metadata.tables)}"))
    env = {
        **os.environ,
        "SAGA_TEST_BROKER": BROKERS[name],
        "SAGA_TEST_STORE": store,
        "SAGA_TEST_QUEUE": queue,
        "SAGA_TEST_DUPLICATE": "1",
        "PYTHONPATH": str(ROOT),
    }
    workers, logs = _spawn_workers(env, queue, tmp, count=2)
    try:
        _wait_ready(test_app, 2, workers)
        yield Harness(name, test_app, in_process=False, workers=workers, logs=logs)
    finally:
        stop_workers(workers)
        # Not found when never declared: every test of this backend here was skipped.
        with (
            test_app.app.connection_for_write() as connection,
            contextlib.suppress(*connection.channel_errors),
        ):
            connection.default_channel.queue_purge(queue)


@pytest.fixture
def sqlite_harness(harness: Harness) -> Harness:
    """For tests that patch the engine in-process: only the in-process backend."""
    if not harness.in_process:
        pytest.skip("needs the in-process worker to patch the engine")
    return harness


_MARIADB_SHARED = os.environ.get("SAGA_TEST_MYSQL", "mysql+pymysql://root@127.0.0.1:3306/test")
MARIADB = _MARIADB_SHARED + _OWN


@pytest.fixture(params=["sqlite", "postgres", "mariadb"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated-on-first-use store on each backend, for tests that drive the engine's
    store writes directly from several threads of this process."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/direct.sqlite3"
    if request.param == "postgres":
        require_services(PORTS["postgres"])
        return _test_database_url()
    return mariadb_url()


_EMPTIED: list[bool] = []


def _empty_mariadb_once() -> None:
    """The MariaDB test database starts each session empty, migrated by this checkout
    (PostgreSQL's is made anew once per session too)."""
    if _EMPTIED:
        return
    from celery_saga.store.database import Database

    admin = create_engine(_MARIADB_SHARED, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        if _OWN:  # this xdist worker's own database, next to the shared one, made anew
            name = MARIADB.rsplit("/", 1)[1]
            connection.execute(text(f"DROP DATABASE IF EXISTS {name}"))
            connection.execute(text(f"CREATE DATABASE {name}"))
        else:  # the shared one: no table another checkout's migrations left behind
            tables = connection.execute(text("SHOW TABLES")).scalars().all()
            connection.execute(text("SET FOREIGN_KEY_CHECKS = 0"))
            for table in tables:
                connection.execute(text(f"DROP TABLE `{table}`"))
            connection.execute(text("SET FOREIGN_KEY_CHECKS = 1"))
    admin.dispose()
    database = Database(MARIADB)
    database.migrate()
    with database.transaction() as connection:
        for table in reversed(saga_metadata.sorted_tables):
            connection.execute(table.delete())
    database.dispose()
    _EMPTIED.append(True)


def mariadb_url() -> str:
    """This process's MariaDB test database, emptied of saga rows once per session."""
    require_services(3306)
    _empty_mariadb_once()
    return MARIADB


def fresh_mariadb_database(suffix: str) -> str:
    """An empty MariaDB database of this process's own, as ``fresh_pg_database``."""
    require_services(3306)
    url = f"{MARIADB}_{suffix}"
    admin = create_engine(_MARIADB_SHARED, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]}"))
        connection.execute(text(f"CREATE DATABASE {url.rsplit('/', 1)[1]}"))
    admin.dispose()
    return url


def unconsumed_app(prefix: str) -> Any:
    """A Celery app on ``memory://`` whose default queue no worker consumes (its own name:
    the in-memory transport is shared by every app in the process)."""
    from celery import Celery

    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    app = Celery(name, broker="memory://localhost/", set_as_current=False)
    app.conf.task_default_queue = name
    return app


@pytest.fixture
def pg_db() -> Iterator[Any]:
    """The saga store on the test PostgreSQL database, migrated."""
    from celery_saga.store.database import Database

    require_services(PORTS["postgres"])
    database = Database(_test_database_url())
    database.migrate()
    yield database
    database.dispose()


@contextlib.contextmanager
def in_process_pg_engine(
    prefix: str, *sagas: Any, concurrency: int = 1, store_url: str | None = None, **conf: Any
) -> Iterator[Any]:
    """A ``SagaEngine`` on the test PostgreSQL database (or ``store_url``, e.g. through a
    cuttable proxy) with ``sagas`` registered and ``conf`` in its app's configuration, and
    an in-process worker consuming its own ``memory://`` queue."""
    from celery_saga import SagaEngine

    require_services(PORTS["postgres"])
    app = unconsumed_app(prefix)
    app.conf.broker_transport_options = {"polling_interval": 0.01}
    app.conf.update(conf)
    engine = SagaEngine(app, store_url=store_url or _test_database_url())
    for saga in sagas:
        engine.register(saga)
    engine.ensure_schema()
    with embedded_worker(app, concurrency=concurrency):
        yield engine
    engine.db.dispose()


@pytest.fixture
def direct(store_url: str) -> Iterator[Any]:
    """A ``SagaEngine`` whose messages go to an unconsumed ``memory://`` queue: the test
    delivers them itself (``engine.executor.run_node``), in the order and threads it wants."""
    from celery_saga import SagaEngine

    engine = SagaEngine(unconsumed_app("direct"), store_url=store_url)
    engine.ensure_schema()
    yield engine
    engine.db.dispose()


@pytest.fixture(params=["sqlite", "postgres", "mariadb"])
def own_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store of the test's own, on each kind of database (the versions tests')."""
    from tests.version_runs import make_own_store

    return make_own_store(request.param, tmp_path)
