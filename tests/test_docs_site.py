"""The docs site builds with ``--strict`` and its API reference documents every public name."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import celery_saga

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = [name for name in celery_saga.__all__ if name != "__version__"]


def test_the_api_page_names_every_public_name() -> None:
    documented = set(
        re.findall(r"^::: celery_saga\.(\w+)$", (ROOT / "docs/api.md").read_text(), re.M)
    )
    assert set(PUBLIC) - documented == set()


def test_the_site_builds_strictly_with_every_public_name_in_the_api_reference(
    tmp_path: Path,
) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    html = (tmp_path / "api" / "index.html").read_text()
    missing = [name for name in PUBLIC if f'id="celery_saga.{name}"' not in html]
    assert missing == []


def test_the_version_comes_from_the_package_metadata() -> None:
    from importlib.metadata import version

    assert celery_saga.__version__ == version("celery-saga-engine")
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", celery_saga.__version__)
