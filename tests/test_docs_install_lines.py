"""Every ``pip install`` of this package that a page shows works as the page says: it is not
on the package index, so each line installs from the clone (``./celery-saga-engine[...]`` beside
it, or ``.`` inside it) and names only extras that ``pyproject.toml`` defines; and the
README's installation lines, run as written against a copy of this working tree, install
a package that imports."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import metadata
from pathlib import Path

import pytest

from tests.docs_runner import parse
from tests.test_packaging import _run

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _extras() -> set[str]:
    """The extras ``pyproject.toml`` defines (its installed metadata before Python 3.11)."""
    try:
        import tomllib
    except ModuleNotFoundError:
        return set(metadata("celery-saga-engine").get_all("Provides-Extra") or [])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return set(project["optional-dependencies"])


EXTRAS = _extras()
#: What follows ``pip install`` (options first): the quoted or bare target.
_INSTALL = re.compile(r"pip install((?:\s+-{1,2}[\w-]+)*)\s+(\"[^\"]+\"|'[^']+'|[^\s`]+)")
#: A target in the clone: the clone's folder beside the reader, or ``.`` inside it.
_FROM_CLONE = re.compile(r"(?:\./celery-saga-engine|\.)(?:\[([\w,\s-]+)\])?")


def install_lines() -> list[tuple[str, str]]:
    """``(where, target)`` for every ``pip install`` in the pages' text and code."""
    found = []
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), start=1):
            for match in _INSTALL.finditer(line):
                found.append((f"{page.name}:{number}", match.group(2).strip("\"'")))
    return found


def test_the_pages_show_pip_install_lines() -> None:
    where = {spot.split(":")[0] for spot, _ in install_lines()}
    # the pages a newcomer installs from: a line lost from one of them is a finding
    assert {"README.md", "installation.md", "django.md", "metrics.md"} <= where, where


@pytest.mark.parametrize(("where", "target"), install_lines(), ids=lambda v: str(v))
def test_each_install_line_installs_from_the_clone_with_extras_that_exist(
    where: str, target: str
) -> None:
    if not target.startswith(".") and not re.match(r"celery[-_]saga", target):
        return  # another package (an HTTP client, say), from the index as usual
    match = _FROM_CLONE.fullmatch(target)
    assert match, (
        f"{where}: pip install {target!r} does not install from the clone "
        "(the package is not on the package index: './celery-saga-engine[...]' or '.[...]')"
    )
    named = {extra.strip() for extra in (match.group(1) or "").split(",") if extra.strip()}
    assert named <= EXTRAS, f"{where}: no such extra {sorted(named - EXTRAS)} in pyproject.toml"


def _copy_of_the_working_tree(destination: Path) -> None:
    """The clone a reader has: this working tree without what building and testing left."""
    shutil.copytree(
        ROOT,
        destination,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv*",
            "venv",
            ".tox",
            "build",
            "dist",
            "site",
            "*.egg-info",
            "__pycache__",
            ".*_cache",
            ".hypothesis",
            "*.sqlite3*",
        ),
    )


@pytest.mark.services  # it reaches the package index for the dependencies
def test_the_readmes_install_lines_install_the_clone_into_a_fresh_virtualenv(
    tmp_path: Path,
) -> None:
    [block] = [b for b in parse(ROOT / "README.md") if "git clone" in b.code]
    commands = [line for line in block.code.splitlines() if line and "git clone" not in line]
    assert any('pip install "./celery-saga-engine[' in line for line in commands), commands
    _copy_of_the_working_tree(tmp_path / "celery-saga-engine")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    done = subprocess.run(
        ["bash", "-e", "-c", "\n".join(commands)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"{commands}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    check = "import celery_saga, redis; print(celery_saga.__file__)"
    out = _run([str(tmp_path / ".venv/bin/python"), "-c", check], cwd=tmp_path, env=env)
    assert "/.venv/" in out, out  # the installed copy, not the working tree
