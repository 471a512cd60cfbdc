"""Engines are disposed after fork: a prefork child never reuses its parent's connections."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import text

from celery_saga.store.database import Database


def test_child_process_starts_with_an_empty_pool(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/fork.sqlite3")
    with db.transaction() as connection:
        connection.execute(text("SELECT 1"))
    assert db.engine.pool.checkedin() == 1  # type: ignore[attr-defined]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports what its pool holds, then leaves at once
        os.close(read)
        os.write(write, str(db.engine.pool.checkedin()).encode())  # type: ignore[attr-defined]
        os._exit(0)
    os.close(write)
    reported = os.read(read, 16).decode()
    os.waitpid(pid, 0)
    assert reported == "0"
    assert db.engine.pool.checkedin() == 1, "the parent keeps its own connection"  # type: ignore[attr-defined]
