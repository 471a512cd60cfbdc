"""Sagas found the Django way: a minimal project laid out as Celery's Django guide says
(tests/djangosite: ``app.autodiscover_tasks()``, sagas in ``orders/sagas.py`` and one in
``orders/tasks.py``, nothing importing them explicitly) starts its sagas from a view and
from ``manage.py shell``, and a real ``celery worker`` of the project runs them.

A run whose step message reaches a worker that never imported the saga's module is handed
back (Celery would drop it as an unregistered task); ``wait()`` then says so."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from celery import Celery

from celery_saga import ExecutionState, RunNotSettledError, Saga, SagaEngine, SagaError
from tests.conftest import BROKERS, PORTS, ROOT, _test_database_url, require_services, stop_workers

SITE = ROOT / "tests" / "djangosite"
BROKER = BROKERS["postgres-rabbitmq"]


@dataclass
class Shop:
    env: dict[str, str]
    engine: SagaEngine  # this process's view of the same store, broker and queue
    log: Path

    def python(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *args],
            cwd=SITE,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=90,
        )


def _wait_for_worker(app: Celery, worker: subprocess.Popen[bytes], log: Path) -> None:
    for _ in range(60):
        if worker.poll() is not None:
            raise RuntimeError(f"the project's worker exited:\n{log.read_text()[-3000:]}")
        if app.control.ping(timeout=1.0):
            return
    raise RuntimeError(f"the project's worker did not answer:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shop]:
    require_services(PORTS["postgres"], PORTS["postgres-rabbitmq"])
    queue = f"shop-{uuid.uuid4().hex[:10]}"
    store = _test_database_url()
    env = {
        **os.environ,
        "SHOP_BROKER": BROKER,
        "SHOP_STORE": store,
        "SHOP_QUEUE": queue,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(SITE)]),
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    app = Celery(queue, broker=BROKER, set_as_current=False)
    app.conf.task_default_queue = queue
    engine = SagaEngine(app, store_url=store)
    engine.ensure_schema()
    log = tmp_path_factory.mktemp("shop") / "worker.log"
    command = [sys.executable, "-m", "celery", "-A", "shopsite", "worker", "-P", "prefork"]
    command += ["-c", "1", "-Q", queue, "-n", f"{queue}@%h", "--without-gossip"]
    command += ["--without-mingle", "-l", "INFO"]
    with open(log, "wb") as output:
        worker = subprocess.Popen(
            command,
            cwd=SITE,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_for_worker(app, worker, log)
        yield Shop(env, engine, log)
    finally:
        stop_workers([worker])
        with (
            app.connection_for_write() as connection,
            contextlib.suppress(*connection.channel_errors),
        ):
            connection.default_channel.queue_purge(queue)
        engine.db.dispose()


_VIEW = """
import os

import django
from django.test import Client

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shopsite.settings")  # as wsgi.py does
django.setup()  # what the WSGI server does, through get_wsgi_application()
client = Client()
for saga in ("shop-refund", "shop-order"):
    print(client.get(f"/orders/{saga}/?order_id=V1").json()["id"])
"""


def test_a_view_starts_sagas_of_sagas_py_and_tasks_py_without_importing_them(
    shop: Shop,
) -> None:
    done = shop.python("-c", _VIEW)
    assert done.returncode == 0, done.stderr
    refund_id, order_id = done.stdout.split()
    refund = shop.engine.handle(refund_id).wait(60)
    order = shop.engine.handle(order_id).wait(60)
    assert (refund.state, order.state) == (ExecutionState.COMPLETED,) * 2, shop.log.read_text()
    assert refund.results == {"notify": "notified V1"}
    assert order.results == {"reserve": "R-V1", "charge": "C-V1"}


def test_manage_py_shell_starts_a_saga_registered_in_tasks_py(shop: Shop) -> None:
    code = "from shopsite.celery import engine\n"
    code += "print(engine.start('shop-refund', {'order_id': 'S1'}).id)"
    done = shop.python("manage.py", "shell", "-v", "0", "-c", code)
    assert done.returncode == 0, done.stderr
    run = shop.engine.handle(done.stdout.split()[-1]).wait(60)
    assert run.state is ExecutionState.COMPLETED, shop.log.read_text()
    assert run.results == {"notify": "notified S1"}


def test_an_unknown_saga_in_the_project_says_where_it_was_looked_for(shop: Shop) -> None:
    code = "from shopsite.celery import engine; engine.start('shop-nope')"
    done = shop.python("manage.py", "shell", "-v", "0", "-c", code)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert "UnknownSagaError: no saga named 'shop-nope'" in last, last
    assert "known: shop-approval, shop-fragile, shop-order, shop-refund" in last, last
    assert "orders.sagas" in last, last
    assert "orders.tasks" in last, last


def test_a_worker_without_the_sagas_module_makes_wait_say_so(shop: Shop) -> None:
    """The project's worker never imported this saga (it is registered only here): it hands
    the step's message back instead of dropping it, and wait() names the likely cause."""
    shop.engine.register(Saga("shop-lonely").step("only", lambda: None))
    run = shop.engine.start("shop-lonely")
    with pytest.raises(RunNotSettledError) as raised:
        run.wait(timeout=3)
    error = raised.value
    assert isinstance(error, TimeoutError) and isinstance(error, SagaError)
    message = str(error)
    assert f"execution '{run.id}' of saga 'shop-lonely' still running after 3s" in message
    assert "at step 'only', whose task 'shop-lonely.only' no worker has taken" in message
    assert "engine.autodiscover_sagas()" in message
    assert "message shop-lonely.only handed back" in shop.log.read_text()
    assert "\n" not in message
