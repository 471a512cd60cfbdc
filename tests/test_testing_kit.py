"""The testing kit's documented example (docs/testing.md) runs as a user's test module would:
in its own pytest process, with the fixtures of the plugin the page's ``conftest.py`` opts
into; without that opt-in, installing the package adds no fixture to anyone's tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.docs_runner import parse

ROOT = Path(__file__).resolve().parent.parent


def _write_the_pages_files(folder: Path, *titles: str) -> None:
    files = {b.title: b.code for b in parse(ROOT / "docs" / "testing.md") if b.title}
    for title in titles:
        (folder / title).write_text(files[title])


def _pytest(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_order_saga.py"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_the_documented_example_tests_a_users_saga(tmp_path: Path) -> None:
    _write_the_pages_files(tmp_path, "conftest.py", "test_order_saga.py")
    done = _pytest(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "3 passed" in done.stdout


def test_the_plugin_is_opt_in(tmp_path: Path) -> None:
    _write_the_pages_files(tmp_path, "test_order_saga.py")
    done = _pytest(tmp_path)
    assert done.returncode != 0
    assert "fixture 'saga_engine' not found" in done.stdout, done.stdout[-3000:]


def test_the_documented_buggy_saga_fails_at_exactly_one_point_which_fails_alone(
    tmp_path: Path,
) -> None:
    _write_the_pages_files(
        tmp_path, "conftest.py", "payment.py", "explore_payment.py", "test_payment.py"
    )
    explored = subprocess.run(
        [sys.executable, "explore_payment.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert explored.returncode == 0, explored.stderr[-3000:]
    assert ", 1 failing\nfail:charge:\n" in explored.stdout, explored.stdout
    assert "reproduce: explore(payment, input, only='fail:charge')" in explored.stdout
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_payment.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout
