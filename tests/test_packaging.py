"""The built wheel, installed into a fresh virtualenv with one extra only, reaches the real
service of that extra: Redis (the README's Quickstart, with a real worker), PostgreSQL and
MariaDB (a run that fails and is compensated). The wheel is built once per session and
each extra gets one virtualenv."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import _test_database_url, mariadb_url, require_services
from tests.docs_runner import run_page
from tests.test_docs_examples import page_env

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.services

STORE_CHECK = """
import sys

from celery import Celery

from celery_saga import Saga, SagaEngine
from celery_saga.worker.embedded import embedded_worker

app = Celery("packaging-check", broker="memory://localhost/")
app.conf.broker_transport_options = {"polling_interval": 0.01}
engine = SagaEngine(app, store_url=sys.argv[1])


def undo() -> None:
    print("undone")


def reserve() -> str:
    return "reserved"


def ship() -> None:
    raise RuntimeError("carrier down")


engine.register(Saga("packaging-check").step(reserve, compensate=undo).step(ship))
with embedded_worker(app):
    run = engine.start("packaging-check").wait(timeout=60)
print(engine.db.engine.dialect.name, run.state.value, run.rollback_status.value)
"""


def _run(command: list[str], **options: object) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, **options)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return str(done.stdout)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(ROOT)])
    [built] = out.glob("celery_saga_engine-*.whl")
    return built


EXTRAS = ("redis", "postgres", "mysql")


@pytest.fixture(scope="session")
def venv_with(
    wheel: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], Path]]:
    """``venv_with("redis")``: the bin directory of a fresh virtualenv holding the wheel
    with that one extra. The three are built at once, in threads (mostly waiting on the
    package index), the first time one is asked for."""

    def make(extra: str) -> Path:
        home = tmp_path_factory.mktemp(f"venv-{extra}")
        _run([sys.executable, "-m", "venv", str(home)])
        _run([str(home / "bin/python"), "-m", "pip", "install", "--quiet", f"{wheel}[{extra}]"])
        return home / "bin"

    with ThreadPoolExecutor(max_workers=len(EXTRAS)) as pool:
        futures = {extra: pool.submit(make, extra) for extra in EXTRAS}
        yield lambda extra: futures[extra].result()


def test_the_wheel_ships_the_library_and_its_licence_only(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"celery_saga"}, tops
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
    assert "celery_saga/store/migrations/env.py" in names
    assert "celery_saga/py.typed" in names
    assert "celery_saga/contrib/django/templates/admin/celery_saga/run/action.html" in names
    for page in ("base", "runs", "run"):  # the web view's templates (the web extra)
        assert f"celery_saga/web/templates/saga_web/{page}.html" in names


def _importable(bin_dir: Path, module: str) -> bool:
    code = f"import importlib.util as u; print(u.find_spec({module!r}) is not None)"
    return _run([str(bin_dir / "python"), "-c", code]).strip() == "True"


def test_the_redis_extra_alone_runs_the_quickstart_against_redis(
    venv_with: Callable[[str], Path], tmp_path: Path
) -> None:
    require_services(6379)
    bin_dir = venv_with("redis")
    assert not _importable(bin_dir, "psycopg"), "the redis extra must not need the others"
    run_page(ROOT / "README.md", tmp_path, page_env(bin_dir))


def test_the_postgres_extra_alone_runs_a_saga_on_postgresql(
    venv_with: Callable[[str], Path], tmp_path: Path
) -> None:
    require_services(5432)
    url = _test_database_url()
    bin_dir = venv_with("postgres")
    assert not _importable(bin_dir, "pymysql")
    (tmp_path / "check.py").write_text(STORE_CHECK)
    out = _run([str(bin_dir / "python"), "check.py", url], cwd=tmp_path)
    assert out.splitlines() == ["undone", "postgresql failed completed"], out


def test_the_mysql_extra_alone_runs_a_saga_on_mariadb(
    venv_with: Callable[[str], Path], tmp_path: Path
) -> None:
    require_services(3306)
    bin_dir = venv_with("mysql")
    assert not _importable(bin_dir, "psycopg")
    (tmp_path / "check.py").write_text(STORE_CHECK)
    out = _run([str(bin_dir / "python"), "check.py", mariadb_url()], cwd=tmp_path)
    assert out.splitlines() == ["undone", "mysql failed completed"], out
