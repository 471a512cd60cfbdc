"""``celery saga versions check``, run from the code about to ship: every run that is not
over whose version that code lacks is named, with whether ``upgrade`` can move it; exit
status 1 while one is left, 0 once they are upgraded or finished. Its read of the runs
uses an index, never a scan of the history."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from sqlalchemy import event, insert, text, update

from celery_saga import ExecutionState
from celery_saga.cli import saga as saga_cli
from celery_saga.store import versions
from celery_saga.store.database import Database
from celery_saga.store.tables import executions, version_shapes
from celery_saga.store.version_shapes import load_shapes
from celery_saga.worker.embedded import embedded_worker
from tests.conftest import ROOT, fresh_mariadb_database
from tests.version_runs import (
    V1,
    approve,
    engine_with,
    give_back_v2,
    hold_v2,
    notify,
    park_v1_runs,
    refund,
    settle,
)


def _check(engine: Any, *options: str) -> Any:
    ctx = type("Ctx", (), {"app": engine.app})()
    return CliRunner().invoke(saga_cli, ["versions", "check", *options], obj=ctx)


def test_check_names_the_runs_a_release_would_strand_until_they_are_upgraded_or_finished(
    own_store: str,
) -> None:
    runs = park_v1_runs(own_store)
    new = engine_with(own_store, approve("2").step("notify", notify), refund("2", give_back_v2))
    found = _check(new, "--json")
    assert found.exit_code == 1, found.output
    report = json.loads(found.stdout)
    stranded = {item["execution_id"]: item for item in report["stranded"]}
    assert report["ok"] is False
    assert set(stranded) == {runs["waiting"], runs["stuck"]}, "the completed run is over"
    waiting, stuck = stranded[runs["waiting"]], stranded[runs["stuck"]]
    assert (waiting["state"], waiting["node"], waiting["label"]) == (
        "waiting",
        "wait_for('ok')",
        "1",
    )
    assert waiting["upgrade"] == {
        "possible": True,
        "to": new.definition("approve").hash,
        "node": None,
        "reason": None,
    }
    assert stuck["state"] == "compensation_stuck"
    assert stuck["upgrade"]["possible"] is False and stuck["upgrade"]["node"] == "take"
    assert "its compensation 'give_back' is 'give_back_v2' there" in stuck["upgrade"]["reason"]
    assert "2 run(s) would be stranded" in found.stderr

    shown = _check(new)
    assert shown.exit_code == 1
    assert runs["waiting"] in shown.stdout and runs["stuck"] in shown.stdout
    assert f"saga upgrade {runs['waiting']} --to" in shown.stdout

    assert new.upgrade(runs["waiting"]).hash == new.definition("approve").hash
    still = _check(new, "--json")
    assert still.exit_code == 1
    assert [i["execution_id"] for i in json.loads(still.stdout)["stranded"]] == [runs["stuck"]]

    old = engine_with(own_store, *V1)  # its unwind is given up where its version is
    old.abandon_compensation(runs["stuck"], reason="refunded by hand")
    cleared = _check(new)
    assert cleared.exit_code == 0, cleared.output
    assert "no run would be stranded" in cleared.stdout
    assert json.loads(_check(new, "--json").stdout) == {"ok": True, "stranded": []}
    old.db.dispose()
    new.db.dispose()


def test_check_without_the_stored_shape_still_names_the_run_and_says_why(
    tmp_path: Path,
) -> None:
    store = f"sqlite:///{tmp_path}/unshaped.sqlite3"
    runs = park_v1_runs(store)
    new = engine_with(store, approve("2", hold_v2), refund("2"))
    with new.db.transaction() as connection:  # as runs stored before shapes were kept
        connection.execute(version_shapes.delete())
    found = new.check_versions()
    assert {r.execution_id for r in found.stranded} == {runs["waiting"], runs["stuck"]}
    assert all(r.stranding.value == "no_shape" and r.node is None for r in found.stranded)
    assert "shape is not in the store" in found.stranded[0].reason
    new.db.dispose()


def test_check_names_runs_of_a_saga_the_release_no_longer_has(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/dropped.sqlite3"
    runs = park_v1_runs(store)
    new = engine_with(store, approve("2").step("notify", notify))
    stuck = {r.execution_id: r for r in new.check_versions().stranded}[runs["stuck"]]
    assert stuck.stranding.value == "no_saga" and stuck.node == "boom"
    new.db.dispose()


def test_a_cancelling_run_is_not_over_for_the_check_nor_for_the_live_count(
    tmp_path: Path,
) -> None:
    store = f"sqlite:///{tmp_path}/cancelling.sqlite3"
    runs = park_v1_runs(store)
    new = engine_with(store, *V1)
    with new.db.transaction() as connection:  # between its cancel and its unwind
        connection.execute(
            update(executions)
            .where(executions.c.id == runs["waiting"])
            .values(state=ExecutionState.CANCELLING.value)
        )
    v1 = new.definition("approve").hash
    assert versions.live_runs(new.db)[("approve", v1)] == 1
    listed = versions.unfinished_runs_outside(new.db, set())
    assert {r.execution_id for r in listed} == {runs["waiting"], runs["stuck"]}
    new.db.dispose()


def test_check_reads_the_runs_through_an_index_on_postgresql(pg_db: Any) -> None:
    """Planned as on a big store (no sequential scans, as the planner does once the runs
    outnumber the pages): the unfinished runs by ``state`` and the owed unwinds by their
    partial index, never a scan of ``saga_executions``."""
    sent: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, sql: str, parameters: Any, *_: Any) -> None:
        if "saga_executions" in sql and sql.lstrip().upper().startswith("SELECT"):
            sent.append((sql, parameters))

    event.listen(pg_db.engine, "before_cursor_execute", record)
    try:
        versions.unfinished_runs_outside(pg_db, {"aaaa", "bbbb"})
        versions.live_runs(pg_db)
    finally:
        event.remove(pg_db.engine, "before_cursor_execute", record)
    assert len(sent) == 2
    for sql, parameters in sent:
        plan = _plan(pg_db, sql, parameters)
        # Which index serves which arm depends on the few rows a test store holds (the state
        # index for both, or the partial one for the owed unwinds); on a filled store the
        # plan is read by tests/test_history_sweeps.py (10,000 runs) and benchmarks/history.py.
        assert "Seq Scan on saga_executions" not in plan, plan
        assert "Index Scan on ix_saga_executions_" in plan, plan
    shapes: list[tuple[str, Any]] = []

    def record_shapes(_conn: Any, _cursor: Any, sql: str, parameters: Any, *_: Any) -> None:
        shapes.append((sql, parameters))

    event.listen(pg_db.engine, "before_cursor_execute", record_shapes)
    try:
        load_shapes(pg_db, [("approve", "aaaa"), ("refund", "bbbb")])
    finally:
        event.remove(pg_db.engine, "before_cursor_execute", record_shapes)
    (plan,) = [_plan(pg_db, sql, parameters) for sql, parameters in shapes]
    # A plain index scan or a bitmap scan of the same key, as the few test rows decide.
    assert "Seq Scan on saga_version_shapes" not in plan, plan
    assert re.search(r"Index Scan (using|on) pk_saga_version_shapes", plan), plan


def _plan(pg_db: Any, sql: str, parameters: Any) -> str:
    with pg_db.engine.connect() as connection:
        transaction = connection.begin()
        connection.execute(text("SET LOCAL enable_seqscan = off"))
        cursor = connection.connection.driver_connection.cursor()
        cursor.execute("EXPLAIN " + sql, parameters)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        transaction.rollback()
    return plan


def test_the_check_is_a_pure_read(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/read.sqlite3"
    park_v1_runs(store)
    new = engine_with(store, approve("2", hold_v2))
    written: list[str] = []

    def record(_conn: Any, _cursor: Any, sql: str, *_: Any) -> None:
        if not sql.lstrip().upper().startswith(("SELECT", "PRAGMA", "BEGIN", "COMMIT", "SET")):
            written.append(sql)

    event.listen(new.db.engine, "before_cursor_execute", record)
    try:
        assert not new.check_versions().ok
    finally:
        event.remove(new.db.engine, "before_cursor_execute", record)
    assert written == [], "the code about to ship writes nothing into the store it checks"
    new.db.dispose()


def _manage_check(store: str, *options: str) -> subprocess.CompletedProcess[str]:
    project = ROOT / "tests" / "djangoproject"
    environment = {
        **os.environ,
        "SAGA_TEST_BROKER": "memory://",
        "SAGA_TEST_STORE": store,
        "SAGA_TEST_QUEUE": "versions-check",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(project)]),
    }
    return subprocess.run(
        [sys.executable, str(project / "manage.py"), "saga", "versions", "check", *options],
        cwd=project,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_manage_py_saga_versions_check_fails_while_a_run_is_stranded(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/django.sqlite3"
    runs = park_v1_runs(store)
    found = _manage_check(store, "--json")
    assert found.returncode == 1, found.stderr
    stranded = {i["execution_id"] for i in json.loads(found.stdout)["stranded"]}
    assert stranded == {runs["waiting"], runs["stuck"]}, "the project's code has no 'approve'"
    old = engine_with(store, *V1)
    old.abandon_compensation(runs["stuck"])
    with embedded_worker(old.app, concurrency=1):
        old.cancel(runs["waiting"])
        settle(old, runs["waiting"], ExecutionState.CANCELLED)
    old.db.dispose()
    passed = _manage_check(store)
    assert passed.returncode == 0, passed.stderr
    assert "no run would be stranded" in passed.stdout


#: Indexes led by ``state``: they hold the unfinished runs apart from the history.
BY_STATE = {
    "ix_saga_executions_wake",
    "ix_saga_executions_state_created",
    "ix_saga_executions_unwind_owed",
}


def test_check_reads_the_runs_through_an_index_on_mariadb() -> None:
    """MariaDB has no partial index: a range over an index on ``state`` serves both arms,
    on a store of its own filled with finished runs (on an empty table the optimizer reads
    it whole, rightly)."""
    store = Database(fresh_mariadb_database("versions_plan"))
    store.migrate()
    stamp = datetime.now(UTC)
    row = {"saga_name": "s", "definition_hash": "h", "state": "completed", "cursor": 0}
    row |= {"cursor_sub": 0, "input": b"", "created_at": stamp, "updated_at": stamp}
    with store.transaction() as connection:
        connection.execute(
            insert(executions), [{**row, "id": f"done-{n}", "version": 1} for n in range(5000)]
        )
    with store.engine.connect() as connection:
        connection.exec_driver_sql("ANALYZE TABLE saga_executions").all()
    sent: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, sql: str, parameters: Any, *_: Any) -> None:
        if "saga_executions" in sql and sql.lstrip().upper().startswith("SELECT"):
            sent.append((sql, parameters))

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        versions.unfinished_runs_outside(store, {"aaaa", "bbbb"})
        versions.live_runs(store)
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    assert len(sent) == 2
    with store.engine.connect() as connection:
        cursor = connection.connection.driver_connection.cursor()
        for sql, parameters in sent:
            cursor.execute("EXPLAIN " + sql, parameters)
            access = {(row[3], row[5]) for row in cursor.fetchall()}
            assert {kind for kind, _ in access} <= {"range", "index_merge"}, access
            keys = {part for _, key in access for part in key.split(",")}
            assert keys <= BY_STATE, access  # not rollback_status: every completed run is NULL
    store.dispose()
