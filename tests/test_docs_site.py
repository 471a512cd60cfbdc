"""The docs site builds with ``--strict``, its API reference documents every public name, and
it works offline: nothing is loaded from elsewhere, and the states diagram is a drawing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import celery_saga
from celery_saga import ExecutionState

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = [name for name in celery_saga.__all__ if name != "__version__"]


def test_the_api_page_names_every_public_name() -> None:
    documented = set(
        re.findall(r"^::: celery_saga\.(\w+)$", (ROOT / "docs/api.md").read_text(), re.M)
    )
    assert set(PUBLIC) - documented == set()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once with ``--strict``."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed")
    built = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(built)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return built


def test_the_site_builds_strictly_with_every_public_name_in_the_api_reference(site: Path) -> None:
    html = (site / "api" / "index.html").read_text()
    missing = [name for name in PUBLIC if f'id="celery_saga.{name}"' not in html]
    assert missing == []


_EXTERNAL = re.compile(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=\"(?:https?:)?//[^\"]+\"")


def test_the_site_loads_no_script_style_or_font_from_elsewhere(site: Path) -> None:
    """Opened offline, every page shows what it shows online: no external script, style
    or font, and no Mermaid block (the theme would fetch Mermaid from a CDN for it)."""
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20
    external = {str(p.relative_to(site)): _EXTERNAL.findall(p.read_text()) for p in pages}
    assert {page: found for page, found in external.items() if found} == {}
    assert [p.name for p in pages if 'class="mermaid"' in p.read_text()] == []


def test_the_states_page_shows_the_drawn_diagram_of_every_state_and_move(site: Path) -> None:
    html = (site / "states" / "index.html").read_text()
    assert re.search(r'<img [^>]*src="../images/states.svg"', html), html[:2000]
    svg = (site / "images" / "states.svg").read_text()
    # drawn by docs/images/render_states.sh from states.dot: every state of the code is a
    # node, and every arrow of the source is in the drawing (redraw after editing it)
    nodes = set(re.findall(r'class="node">\s*<title>(\w+)</title>', svg))
    assert {state.value for state in ExecutionState} <= nodes, nodes
    source = (ROOT / "docs" / "images" / "states.dot").read_text()
    arrows = re.findall(r"^\s*(\w+) -> (\w+)", source, re.MULTILINE)
    assert len(arrows) >= 12
    drawn = set(re.findall(r'class="edge">\s*<title>(\w+)&#45;&gt;(\w+)</title>', svg))
    assert set(arrows) == drawn


_SPHINX_ROLE = re.compile(r":(?:func|class|meth|attr|exc|mod|data|obj):`")


def test_docstrings_use_markdown_not_sphinx_roles() -> None:
    """The API reference renders docstrings as Markdown, where a role shows as typed."""
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "celery_saga").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if _SPHINX_ROLE.search(line)
    ]
    assert found == []


def test_the_version_comes_from_the_package_metadata() -> None:
    from importlib.metadata import version

    assert celery_saga.__version__ == version("celery-saga-engine")
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", celery_saga.__version__)


def _nav_pages(entries: list[Any]) -> list[str]:
    """The Markdown files of an mkdocs ``nav`` (sections nest), in order."""
    pages = []
    for entry in entries:
        for target in entry.values() if isinstance(entry, dict) else [entry]:
            pages.extend(_nav_pages(target) if isinstance(target, list) else [target])
    return pages


def test_the_overview_lists_every_page_of_the_site() -> None:
    yaml = pytest.importorskip("yaml", reason="the docs extra is not installed")
    nav = _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    pages_section = (ROOT / "docs" / "index.md").read_text().split("\n## Pages\n", 1)[1]
    listed = set(re.findall(r"\]\(([\w-]+\.md)(?:#[\w-]*)?\)", pages_section))
    assert [page for page in nav if page != "index.md" and page not in listed] == []
