"""The benchmark of the direct path against SQLAlchemy runs both ways and cleans up."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from sqlalchemy import create_engine, text

from tests.conftest import PORTS, ROOT, _test_database_url, require_services


def test_direct_statements_times_both_ways_and_drops_its_schema() -> None:
    require_services(PORTS["postgres"])
    url = _test_database_url()
    done = subprocess.run(
        [sys.executable, "benchmarks/direct_statements.py", "--count", "20", "--warmup", "2"],
        cwd=ROOT,
        env={**os.environ, "BENCH_STORE_URL": url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    number = r"\s+\d+\.\d{3}"
    for label in ("step claim", "step completed", "reversal claim"):
        for way in ("direct", "sqlalchemy"):
            assert re.search(rf"^  {label}\s+{way}({number}){{4}}$", done.stdout, re.M), done.stdout
    engine = create_engine(url)
    with engine.connect() as connection:
        left = connection.execute(
            text("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'direct_statements_%'")
        ).all()
    engine.dispose()
    assert left == []
