"""The statements a sweep or an operator read sends, captured as it runs, and their plans.

``capture(engine, call)`` records every SELECT that ``call`` sends through ``engine``;
``explain`` runs ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` of each in a transaction that
is rolled back (the retention claim locks its rows), and ``rows_read`` adds up what the plan
read from ``saga_executions``: the rows it returned and the rows its filters threw away. A
sweep that reads history shows it there, whatever access path the planner picked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, event, text

RUNS_TABLE = "saga_executions"


@dataclass(frozen=True)
class Statement:
    sql: str
    parameters: Any
    #: The ``SET LOCAL`` the caller sent before it in its transaction, replayed by ``explain``.
    settings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    statement: Statement
    tree: dict[str, Any]

    @property
    def rows_read(self) -> int:
        return sum(_read(node) for node in _nodes(self.tree) if _on_runs(node))

    @property
    def seq_scan(self) -> bool:
        return any(n["Node Type"] == "Seq Scan" and _on_runs(n) for n in _nodes(self.tree))

    def lines(self) -> list[str]:
        return [line for node, depth in _walk(self.tree, 0) for line in [_line(node, depth)]]


@contextmanager
def capture(engine: Engine) -> Iterator[list[Statement]]:
    seen: list[Statement] = []
    settings: list[str] = []

    def record(_conn: Any, _cursor: Any, sql: str, parameters: Any, *_: Any) -> None:
        start = sql.lstrip().upper()
        if start.startswith("SET LOCAL"):
            settings.append(sql)
        elif start.startswith("SELECT"):
            seen.append(Statement(sql, parameters, tuple(settings)))
            settings.clear()

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def statements_of(engine: Engine, call: Callable[[], object]) -> list[Statement]:
    with capture(engine) as seen:
        call()
    return [s for s in seen if RUNS_TABLE in s.sql and "pg_" not in s.sql]


def explain(engine: Engine, statement: Statement, *, no_seq_scan: bool = False) -> Plan:
    """The executed plan; ``no_seq_scan`` asks the planner to avoid sequential scans, as it
    does on its own once the table is big (a test store is small)."""
    with engine.connect() as connection:
        transaction = connection.begin()
        if no_seq_scan:
            connection.execute(text("SET LOCAL enable_seqscan = off"))
            connection.execute(text("SET LOCAL random_page_cost = 1.1"))
        for setting in statement.settings:
            connection.exec_driver_sql(setting)
        cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement.sql, statement.parameters
        )
        tree = cursor.fetchone()[0][0]["Plan"]
        transaction.rollback()
    return Plan(statement, tree)


def _nodes(tree: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for node, _ in _walk(tree, 0):
        yield node


def _walk(tree: dict[str, Any], depth: int) -> Iterator[tuple[dict[str, Any], int]]:
    yield tree, depth
    for child in tree.get("Plans", ()):
        yield from _walk(child, depth + 1)


def _on_runs(node: dict[str, Any]) -> bool:
    """A node that reads runs: a scan of the table, or a bitmap scan of one of its indexes
    (the heap scan above a bitmap reads only the rows the bitmaps leave; what each bitmap
    read is on its own node)."""
    if node.get("Relation Name") == RUNS_TABLE:
        return True
    index = str(node.get("Index Name", ""))
    bitmap = node["Node Type"] == "Bitmap Index Scan"
    return bitmap and (index.startswith(f"ix_{RUNS_TABLE}_") or index == f"{RUNS_TABLE}_pkey")


def _read(node: dict[str, Any]) -> int:
    loops = node.get("Actual Loops", 1)
    removed = node.get("Rows Removed by Filter", 0) + node.get("Rows Removed by Index Recheck", 0)
    return int((node.get("Actual Rows", 0) + removed) * loops)


def _line(node: dict[str, Any], depth: int) -> str:
    what = node["Node Type"]
    if "Index Name" in node:
        what += f" using {node['Index Name']}"
    if "Relation Name" in node:
        what += f" on {node['Relation Name']}"
    condition = node.get("Index Cond") or node.get("Recheck Cond") or ""
    rows = node.get("Actual Rows", 0) * node.get("Actual Loops", 1)
    removed = node.get("Rows Removed by Filter", 0) * node.get("Actual Loops", 1)
    extra = f" (removed by filter: {removed})" if removed else ""
    sort = ""
    if "Sort Method" in node:
        sort = f" [{node['Sort Method']}, {node.get('Sort Space Type', '')}]"
    return f"{'  ' * depth}{what} {condition} rows={rows}{extra}{sort}".rstrip()
