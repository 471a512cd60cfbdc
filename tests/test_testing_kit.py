"""The testing kit's documented example (docs/testing.md) runs as a user's test module would:
in its own pytest process, with the fixtures coming from the installed plugin."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_documented_example_tests_a_users_saga(tmp_path: Path) -> None:
    page = (ROOT / "docs" / "testing.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", page, re.DOTALL)
    (tmp_path / "test_order_saga.py").write_text(code)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_order_saga.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "3 passed" in done.stdout
