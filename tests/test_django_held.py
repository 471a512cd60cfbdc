"""Issue 42 in Django: the admin's retry, skip and unwind of held runs, behind the
``move_held_run`` permission and asked first, recorded with the Django user; and
``manage.py saga retry``. Driven in the minimal project of tests/djangosite (its own
process, eager runs, SQLite)."""

from __future__ import annotations

from pathlib import Path

from tests.django_probe import run_probe


def test_the_admin_and_manage_py_move_held_runs(tmp_path: Path) -> None:
    seen = run_probe("held_probe.py", f"sqlite:///{tmp_path / 'shop.sqlite3'}", "held")
    assert seen["held"] == ["held"] * 4
    assert seen["page"] == [True], "the run's page says what holds it"
    assert seen["offered"] == [False, True], "only with move_held_run"
    assert seen["refused"] == [200, "held", []]
    assert seen["asks"] == [200, True, "held"]
    assert seen["retry"] == [200, "completed", [["hold-retried", "ops", "provider back"]]]
    assert seen["skip_bad_json"] == [200, True, "held"]
    status, state, result, rows = seen["skip"]
    assert (status, state, result) == (200, "completed", "C-by-hand")
    assert [row[:2] for row in rows] == [["hold-skipped", "ops"]]
    assert seen["unwind"] == [200, "failed", [["hold-unwound", "ops", "customer gave up"]]]
    assert seen["again"] == [200, True, 1], "refused naming the state, nothing recorded"
    assert seen["command"] == ["completed", "from the shell"]
