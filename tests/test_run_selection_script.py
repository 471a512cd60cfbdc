"""The --where page benchmark fills a store of its own, EXPLAINs each filter's pages on
the store's own read settings, and drops its schema."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from sqlalchemy import create_engine, text

from tests.conftest import PORTS, ROOT, _test_database_url, require_services


def test_run_selection_explains_each_filters_pages_and_drops_its_schema() -> None:
    require_services(PORTS["postgres"])
    url = _test_database_url()
    done = subprocess.run(
        [sys.executable, "benchmarks/run_selection.py", "--runs", "30000"],
        cwd=ROOT,
        env={**os.environ, "BENCH_STORE_URL": url, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    row = r"^  {name}\s+{page}\s+\d+\s+\d+\.\d{{3}}\s+\d+  (Index|Seq|Bitmap)"
    for name in ("label", "label\\+state", "state", "saga\\+older", "state\\+error"):
        assert re.search(row.format(name=name, page="first"), done.stdout, re.M), done.stdout
    # Past its first page, a label's page walks the labels' index from the cursor.
    deep = row.format(name="label\\+state", page="deep").replace("(Index|Seq|Bitmap)", "")
    assert re.search(deep + "Index Only Scan ix_saga_run_labels_key_value", done.stdout, re.M)
    engine = create_engine(url)
    with engine.connect() as connection:
        left = connection.execute(
            text("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'run_selection_%'")
        ).all()
    engine.dispose()
    assert left == []
