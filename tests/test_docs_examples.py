"""The feature pages' examples run as written (each page's ``python`` blocks, in order, in a
fresh directory and interpreter), and print what the page says they print."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = ["waits-and-signals.md", "loops.md", "sub-sagas.md", "retention.md"]
_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)
#: ``print(x)  # shown`` in a page: the line the example prints there.
_SHOWN = re.compile(r"print\(.*\)\s+# (.+)$")


@pytest.mark.parametrize("page", PAGES)
def test_the_pages_example_runs_and_prints_what_it_says(page: str, tmp_path: Path) -> None:
    code = "\n".join(_BLOCK.findall((DOCS / page).read_text()))
    assert code, f"{page} has no python example"
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(DOCS.parent), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout
    for line in code.splitlines():
        shown = _SHOWN.search(line)
        if shown and not shown.group(1).startswith(("e.g.", "(")):
            assert shown.group(1).split(":")[0] in printed, (shown.group(1), printed)

