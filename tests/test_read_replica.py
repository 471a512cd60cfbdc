"""Operators' reads off a read replica (``saga_read_store_url``): ``list``, ``show``, ``stats``
and the web view read the replica and send nothing to the store that runs the sagas, while
the engine's own calls keep to the store; the Django admin (tests/djangosite) reads the
replica's alias; a view on a lagging replica says how far behind it is. On PostgreSQL with
a real streaming replica (``pg_basebackup`` of a cluster of the test's own, made to lag by
pausing its replay), and on SQLite with a copy of the store."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner, Result

from celery_saga import Saga, SagaEngine
from celery_saga.cli import saga
from celery_saga.errors import StoreConfigurationError
from celery_saga.gauges import StoreGauges
from celery_saga.store.replica import ReplicaLag, Standing, replica_lag, standing_of
from celery_saga.web import Credentials, WebSettings, create_app
from tests import pg_cluster
from tests.conftest import unconsumed_app
from tests.django_probe import run_probe

AUTH = ("ops", "pw")


def _reserve(ctx: Any) -> None:
    return None


def _engine(store: str, read_store: str | None = None) -> SagaEngine:
    """An engine whose runs stay where they start (no worker consumes its queue)."""
    app = unconsumed_app("replica")
    app.conf.update(saga_store_url=store, saga_read_store_url=read_store)
    engine = SagaEngine(app)
    engine.register(Saga("held").step("reserve", _reserve).wait_for("go"))
    engine.ensure_schema()
    return engine


def _cli(engine: SagaEngine, *args: str) -> Result:
    obj = SimpleNamespace(app=engine.app)
    return CliRunner().invoke(saga, list(args), obj=obj, catch_exceptions=False)


def _listed(engine: SagaEngine) -> list[str] | None:
    """The ids ``saga list`` prints; None when it failed (a replica without the tables yet)."""
    result = _cli(engine, "list", "--json")
    if result.exit_code != 0:
        return None
    return [item["id"] for item in json.loads(result.stdout)["items"]]


def _until(condition: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.05)


# -- the staleness rule -------------------------------------------------------------------


def test_a_streaming_standby_that_replayed_all_it_received_is_caught_up() -> None:
    """However old its last replayed change (an idle store commits nothing)."""
    lag = standing_of(standby=True, streaming=True, replayed=True, since_replay=3600.0)
    assert lag == ReplicaLag(Standing.CAUGHT_UP, timedelta(0))
    assert not lag.worth_saying


def test_a_standby_with_changes_left_to_replay_is_as_old_as_its_last_replayed_change() -> None:
    lag = standing_of(standby=True, streaming=True, replayed=False, since_replay=2.5)
    assert lag == ReplicaLag(Standing.BEHIND, timedelta(seconds=2.5))
    assert lag.describe() == "read from a replica up to 2.5 s behind the store"


def test_a_standby_cut_off_from_the_store_says_so_with_its_last_replayed_change() -> None:
    lag = standing_of(standby=True, streaming=False, replayed=True, since_replay=150.0)
    assert lag.standing is Standing.DISCONNECTED and lag.behind == timedelta(seconds=150)
    assert "receives nothing from the store" in lag.describe() and "2.5 min" in lag.describe()


def test_a_promoted_replica_no_longer_follows_the_store() -> None:
    lag = standing_of(standby=False, streaming=False, replayed=True, since_replay=None)
    assert lag.standing is Standing.PROMOTED and lag.worth_saying


# -- bad settings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("read_store", "said"),
    [
        ("postgresql+psycopg://ops@replica.internal/saga", "names a postgresql database"),
        ("not a url", "saga_read_store_url: the store URL cannot be read"),
    ],
)
def test_a_read_store_that_cannot_be_a_replica_of_the_store_is_refused_at_once(
    tmp_path: Path, read_store: str, said: str
) -> None:
    store = tmp_path / "store.sqlite3"
    app = unconsumed_app("replica")
    app.conf.update(saga_store_url=f"sqlite:///{store}", saga_read_store_url=read_store)
    with pytest.raises(StoreConfigurationError, match=said):
        SagaEngine(app)
    assert not store.exists()  # nothing opened, nothing stored


# -- SQLite: a copy of the store as the read store ---------------------------------------


def test_views_read_the_read_store_and_the_engine_keeps_to_the_store(tmp_path: Path) -> None:
    store, copy = tmp_path / "store.sqlite3", tmp_path / "copy.sqlite3"
    before = _engine(f"sqlite:///{store}").start("held", {})
    with sqlite3.connect(store) as source, sqlite3.connect(copy) as target:
        source.backup(target)
    engine = _engine(f"sqlite:///{store}", f"sqlite:///{copy}")
    after = engine.start("held", {})
    assert _listed(engine) == [before.id]
    assert engine.get(after.id).id == after.id  # the engine's own reads: the store
    result = _cli(engine, "show", before.id)
    assert "note: read from a replica; its lag is not read on sqlite" in result.stderr
    client = create_app(engine, WebSettings(Credentials(*AUTH))).test_client()
    page = client.get(f"/runs/{before.id}", auth=AUTH).get_data(as_text=True)
    assert 'id="staleness"' in page and "its lag is not read on sqlite" in page
    assert client.get(f"/runs/{after.id}", auth=AUTH).status_code == 404
    gauges = StoreGauges(engine.db)
    gauges.refresh()
    assert gauges.up and gauges.reading.runs == {("held", "running"): 1}  # 2 on the store


def test_an_operators_verb_finds_its_run_on_the_store_not_on_the_replica(tmp_path: Path) -> None:
    """``signal`` (as ``resume``, ``abandon``, ``cancel``) checks the run it acts on where it
    acts: a run the replica does not have yet is still found."""
    store, copy = tmp_path / "store.sqlite3", tmp_path / "copy.sqlite3"
    _engine(f"sqlite:///{store}")
    with sqlite3.connect(store) as source, sqlite3.connect(copy) as target:
        source.backup(target)
    engine = _engine(f"sqlite:///{store}", f"sqlite:///{copy}")
    run = engine.start("held", {})
    result = _cli(engine, "signal", run.id, "go")
    assert result.exit_code == 0, result.output
    assert "signal 'go' recorded" in result.stdout


def test_without_a_read_store_views_say_nothing_of_staleness(tmp_path: Path) -> None:
    engine = _engine(f"sqlite:///{tmp_path / 'store.sqlite3'}")
    run = engine.start("held", {})
    assert replica_lag(engine.db).standing is Standing.PRIMARY
    assert _cli(engine, "show", run.id).stderr == ""
    client = create_app(engine, WebSettings(Credentials(*AUTH))).test_client()
    assert 'id="staleness"' not in client.get(f"/runs/{run.id}", auth=AUTH).get_data(True)


# -- PostgreSQL: a real streaming replica ----------------------------------------------------


@pytest.fixture(scope="module")
def clusters() -> Iterator[tuple[pg_cluster.OwnCluster, pg_cluster.Standby]]:
    reason = pg_cluster.available()
    if reason is not None:
        pytest.fail(f"a test cluster cannot be made here: {reason}")
    primary = pg_cluster.OwnCluster()
    try:
        standby = pg_cluster.Standby(primary)
    except BaseException:
        primary.close()
        raise
    yield primary, standby
    standby.close()
    primary.close()


@pytest.mark.services
def test_views_read_a_streaming_replica_and_say_how_far_behind_it_is(
    clusters: tuple[pg_cluster.OwnCluster, pg_cluster.Standby],
) -> None:
    primary, standby = clusters
    engine = _engine(primary.url(), standby.url())
    first = engine.start("held", {})
    _until(lambda: _listed(engine) == [first.id])
    _until(lambda: replica_lag(engine.db).standing is Standing.CAUGHT_UP)
    client = create_app(engine, WebSettings(Credentials(*AUTH))).test_client()
    assert 'id="staleness"' not in client.get(f"/runs/{first.id}", auth=AUTH).get_data(True)

    standby.pause()
    try:
        second = engine.start("held", {})
        _until(standby.received_unreplayed)
        time.sleep(1.0)
        lag = replica_lag(engine.db)
        assert lag.standing is Standing.BEHIND
        assert lag.behind is not None and lag.behind >= timedelta(seconds=1)
        assert _listed(engine) == [first.id]  # the replica's view: as it was
        assert engine.get(second.id).id == second.id  # the engine's: the store's
        said = _cli(engine, "list").stderr
        assert said.startswith("note: read from a replica up to ") and "behind the store" in said
        page = client.get(f"/runs/{first.id}", auth=AUTH).get_data(as_text=True)
        assert "read from a replica up to " in page and 'id="staleness"' in page
    finally:
        standby.resume()
    _until(lambda: _listed(engine) == [first.id, second.id])
    _until(lambda: replica_lag(engine.db).standing is Standing.CAUGHT_UP)


@pytest.mark.services
def test_list_show_stats_and_the_run_page_send_nothing_to_the_store(
    clusters: tuple[pg_cluster.OwnCluster, pg_cluster.Standby],
) -> None:
    primary, standby = clusters
    engine = _engine(primary.url(), standby.url())
    run = engine.start("held", {})
    client = create_app(engine, WebSettings(Credentials(*AUTH))).test_client()
    _until(lambda: run.id in (_listed(engine) or []))
    on_the_store = engine.db.statement_count
    assert engine.db.replica is not None
    on_the_replica = engine.db.replica.statement_count
    for args in (["list"], ["list", "--json"], ["show", run.id], ["show", run.id, "--json"]):
        assert _cli(engine, *args).exit_code == 0
    assert _cli(engine, "stats").exit_code == 0
    assert client.get(f"/runs/{run.id}", auth=AUTH).status_code == 200
    assert engine.db.statement_count == on_the_store
    assert engine.db.replica.statement_count > on_the_replica


def _admin_probe(store: str, read_store: str, runs: list[str], folder: Path) -> dict[str, Any]:
    return run_probe(
        "replica_probe.py",
        store,
        "replica-admin",
        SHOP_READ_STORE=read_store,
        SHOP_DJANGO_DB=str(folder / "django.sqlite3"),
        SHOP_RUNS=",".join(runs),
    )


@pytest.mark.services
def test_the_django_admin_reads_the_replica_and_says_how_far_behind_it_is(
    clusters: tuple[pg_cluster.OwnCluster, pg_cluster.Standby], tmp_path: Path
) -> None:
    primary, standby = clusters
    engine = _engine(primary.url(), standby.url())
    first = engine.start("held", {})
    _until(lambda: first.id in (_listed(engine) or []))
    standby.pause()
    try:
        second = engine.start("held", {})
        _until(standby.received_unreplayed)
        time.sleep(1.0)
        seen = _admin_probe(primary.url(), standby.url(), [first.id, second.id], tmp_path)
    finally:
        standby.resume()
    assert seen["checks"] == []
    assert seen["list"] == [200, [True, False]]  # the replica's runs, not the store's newest
    assert seen["list_says"] is True
    assert seen["pages"] == [200, 200] and seen["page_says"] == [True, True]
    assert seen["check_unknown"] == ["celery_saga.E002"]  # an alias DATABASES lacks
