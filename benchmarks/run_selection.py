"""What a page of ``--where`` costs on a filled store (PostgreSQL): the query builder of
``store/run_selection.py`` EXPLAINed, first page and a deep page, for each kind of term.

    BENCH_STORE_URL=postgresql+psycopg://... python benchmarks/run_selection.py [--runs N]

The store is made in a schema of its own (dropped at the end) and filled with ``--runs``
runs in one INSERT ... SELECT: five sagas, mostly completed, 2% waiting (each of them
``tier=gold``), 0.5% parked; every run labelled ``customer`` (one of 10,000), every
tenth ``tier=gold``. After
``ANALYZE``, each filter's first page, and the page after a cursor half-way through its
runs, runs under ``EXPLAIN (ANALYZE, BUFFERS)``; the script prints the time, the shared
buffers read, and the index the plan starts from ("Seq Scan" if none). A page that costs
the same buffers deep in the store as at its start is keyset pagination working.
"""

from __future__ import annotations

import argparse
import os
import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import make_url

from celery_saga.run_filter import parse_where
from celery_saga.runtime.clock import get_clock
from celery_saga.store import run_selection
from celery_saga.store.database import KEYSET_PLAN, Database, from_db_time

FILTERS = (
    ("label", ["label.customer=4242"]),
    ("label+state", ["label.tier=gold", "state=waiting"]),
    ("state", ["state=compensation_stuck"]),
    ("saga+older", ["saga=saga3", "older=1h"]),
    ("state+error", ["state=compensation_stuck", "error~timeout"]),
)
PAGE = 100

FILL = """
INSERT INTO saga_executions (id, saga_name, definition_hash, state, cursor, cursor_sub,
    input, failure_reason, created_at, updated_at, version, members_settled, members_failed)
SELECT lpad(to_hex(n), 16, '0'), 'saga' || (n % 5), 'h' || (n % 5),
    CASE WHEN n % 200 = 7 THEN 'compensation_stuck' WHEN n % 50 = 10 THEN 'waiting'
         ELSE 'completed' END,
    0, 0, '\\x00'::bytea,
    CASE WHEN n % 200 = 7 THEN (CASE WHEN n % 400 = 7 THEN 'read timeout' ELSE 'declined' END)
    END,
    now() - interval '2 hours' + n * interval '1 millisecond',
    now() - interval '2 hours' + n * interval '1 millisecond', 1, 0, 0
FROM generate_series(1, :runs) AS n;
INSERT INTO saga_run_labels (execution_id, key, value)
SELECT lpad(to_hex(n), 16, '0'), 'customer', (n % 10000)::text FROM generate_series(1, :runs) n;
INSERT INTO saga_run_labels (execution_id, key, value)
SELECT lpad(to_hex(n), 16, '0'), 'tier', 'gold' FROM generate_series(1, :runs) n
WHERE n % 10 = 0;
"""


def _sql(query: Any) -> str:
    compiled = query.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True})
    return str(compiled)


def _explain(connection: Any, query: Any) -> tuple[float, int, str]:
    """The plan the store's read of a page gets (``Database.read(in_order=True)``)."""
    for setting in KEYSET_PLAN:
        connection.execute(text(setting))
    plan = connection.execute(
        text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + _sql(query))
    ).scalar_one()[0]
    top = plan["Plan"]

    def first_scan(node: dict[str, Any]) -> str:
        if "Scan" in node["Node Type"]:
            return f"{node['Node Type']} {node.get('Index Name', node.get('Relation Name', ''))}"
        for child in node.get("Plans", []):
            return first_scan(child)
        return node["Node Type"]

    buffers = top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
    return plan["Execution Time"], buffers, first_scan(top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    args = parser.parse_args()
    url = os.environ["BENCH_STORE_URL"]
    schema = f"run_selection_{uuid.uuid4().hex[:8]}"
    admin = create_engine(url)
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    scoped = make_url(url).update_query_dict({"options": f"-csearch_path={schema}"})
    db = Database(scoped.render_as_string(hide_password=False))
    try:
        db.migrate()
        with db.engine.begin() as connection:
            for statement in FILL.split(";"):
                if statement.strip():
                    connection.execute(text(statement), {"runs": args.runs})
        with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.execute(text("ANALYZE"))
        now = get_clock().now() + timedelta(seconds=1)
        print(f"{args.runs} runs; pages of {PAGE}")
        print(f"  {'filter':<14}{'page':<7}{'rows':>6}{'ms':>9}{'buffers':>9}  starts from")
        with db.engine.connect() as connection:
            for name, terms in FILTERS:
                run_filter = parse_where(terms)
                every = run_selection.count(db, run_filter, now=now)
                middle = None
                if every > PAGE:
                    half = run_selection.page_query(
                        run_filter, now=now, after=None, limit=max(1, every // 2)
                    )
                    last = db.read(half, in_order=True)[-1]
                    made = None if run_filter.labels else from_db_time(last["created_at"])
                    middle = f"{'' if made is None else made.isoformat()}|{last['id']}"
                for page, after in (("first", None), ("deep", middle)):
                    if page == "deep" and after is None:
                        continue
                    query = run_selection.page_query(run_filter, now=now, after=after, limit=PAGE)
                    with connection.begin():
                        took, buffers, scan = _explain(connection, query)
                    rows_seen = len(db.read(query, in_order=True))
                    print(f"  {name:<14}{page:<7}{rows_seen:>6}{took:>9.3f}{buffers:>9}  {scan}")
    finally:
        db.dispose()
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


if __name__ == "__main__":
    main()
