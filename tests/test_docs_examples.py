"""Every code block of README.md and docs/ runs as written (tests/docs_runner.py says how
a page marks files, commands, transcripts and blocks that cannot run), and prints what the
page says it prints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import XDIST_INDEX, require_services
from tests.docs_runner import RUNNABLE, parse, run_page

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Pages whose examples talk to a server: the ports they need.
SERVICES = {"README.md": [6379], "django.md": [6379]}
#: The Redis database of these tests (0 is the harness's; one per xdist worker, since a
#: page's worker consumes the default queue).
REDIS_URL = os.environ.get("SAGA_TEST_DOCS_REDIS", f"redis://127.0.0.1:6379/{8 + XDIST_INDEX}")


def page_env(bin_dir: Path, **extra: str) -> dict[str, str]:
    """What a reader's shell has: the virtualenv first on PATH, the broker of the tests."""
    return {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/tmp"),
        "LANG": "C.UTF-8",
        "CELERY_BROKER_URL": REDIS_URL,
        **extra,
    }


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_pages_examples_run_as_written(page: Path, tmp_path: Path) -> None:
    require_services(*SERVICES.get(page.name, []))
    env = page_env(Path(sys.executable).parent, PYTHONPATH=str(ROOT))
    run_page(page, tmp_path, env)


def test_every_python_and_shell_block_runs_or_says_why_not() -> None:
    counted = {"run": 0, "not run": 0}
    for page in PAGES:
        for block in parse(page):  # parse fails on a missing language or reason
            if block.language in RUNNABLE:
                counted["not run" if block.not_run else "run"] += 1
    assert counted["run"] > 3 * counted["not run"], counted


#: Runs README.md's shop.py with its charge failing, on an in-process worker: the refund's
#: provider timed out after taking the money, as docs/compensation.md puts it.
_CHARGE_FAILS = """
from celery_saga.worker.embedded import embedded_worker

import shop


def charge_card(ctx):
    raise TimeoutError("the card provider did not answer")


shop.charge_card.__code__ = charge_card.__code__  # the saga as registered, its body failing
shop.engine.ensure_schema()
with embedded_worker(shop.app):
    run = shop.engine.start("order", {"order_id": "C3", "items": ["book"]})
    execution = run.wait(timeout=60)
print(execution.state.value, execution.rollback_status.value)
for step in execution.steps:
    print("step", step.name, step.status.value, getattr(step.compensation_status, "value", "-"))
"""


def test_the_readmes_refund_runs_when_the_charge_itself_failed(tmp_path: Path) -> None:
    """A failed step is reversed too (guarantee 6): README.md's compensation then gets
    ``forward_result=None`` and must not fail on it, or the run parks."""
    [shop] = [b for b in parse(ROOT / "README.md") if b.title == "shop.py"]
    (tmp_path / "shop.py").write_text(shop.code)
    (tmp_path / "charge_fails.py").write_text(_CHARGE_FAILS)
    env = page_env(
        Path(sys.executable).parent,
        PYTHONPATH=f"{tmp_path}:{ROOT}",
        CELERY_BROKER_URL="memory://localhost/",
        SAGA_STORE_URL=f"sqlite:///{tmp_path}/shop.sqlite3",
    )
    done = subprocess.run(
        [sys.executable, "charge_fails.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert "failed completed" in lines, done.stdout + done.stderr[-4000:]
    assert "step charge_card failed compensated" in lines, done.stdout
    assert "step reserve_stock completed compensated" in lines, done.stdout
