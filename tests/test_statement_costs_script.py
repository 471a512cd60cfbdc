"""The statement-cost benchmark runs the store's real hot-path writes and cleans up."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from sqlalchemy import create_engine, text

from tests.conftest import PORTS, ROOT, _test_database_url, require_services


def test_statement_costs_measures_every_write_and_drops_its_schema() -> None:
    require_services(PORTS["postgres"])
    url = _test_database_url()
    done = subprocess.run(
        [sys.executable, "benchmarks/statement_costs.py", "--count", "20", "--repeats", "1"],
        cwd=ROOT,
        env={**os.environ, "BENCH_STORE_URL": url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    number = r"\s+\d+\.\d{3}"
    for label in ("chain write", "new run", "forward claim", "reversal outcome"):
        assert re.search(rf"^  {label}{number}{number}{number}$", done.stdout, re.M), done.stdout
    # Twenty runs may spend less than one clock tick of server CPU: no ratio is shown then.
    ratios = r"(\s+\d+\.\d\dx){2}\s+(\d+\.\d\dx|-)"
    assert re.search(rf"^  reversal(\s+\d+\.\d{{3}}){{3}}{ratios}$", done.stdout, re.M), done.stdout
    engine = create_engine(url)
    with engine.connect() as connection:
        left = connection.execute(
            text("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'statement_costs_%'")
        ).all()
    engine.dispose()
    assert left == []
