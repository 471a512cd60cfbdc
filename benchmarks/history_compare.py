"""The sweeps and operator reads timed on several filled stores in ONE interleaved run.

Timed one store after the other, a store measured while the shared machine was busy looks
slower than one measured while it was quiet, whatever it holds: at a millisecond per call,
a neighbour's burst doubles a median. Here every round calls each operation once on every
store in turn (the order rotating from round to round), so the stores share the machine's
noise, and the ratio of their medians is what their content costs.

Beside the wall time of the call (client included), the server's own time for the same
statements: the sum of ``Planning Time`` and ``Execution Time`` that ``EXPLAIN ANALYZE``
reports for each statement the call sends (the median of ``EXPLAIN_REPEATS`` runs each).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from history_plans import Statement, statements_of
from sqlalchemy import Engine, text

EXPLAIN_REPEATS = 15


@dataclass
class Store:
    """One filled store: its label (``3,000,000``), its engine, and its operations."""

    label: str
    engine: Engine
    calls: dict[str, Callable[[], object]]
    times: dict[str, list[float]] = field(default_factory=dict)


def interleaved(stores: Sequence[Store], repeats: int) -> None:
    """Time every operation on every store, a round at a time."""
    for store in stores:
        for call in store.calls.values():
            call()  # connections and compiled statements, as a running worker has them
    names = list(stores[0].calls)
    for round_ in range(repeats):
        order = list(stores[round_ % len(stores) :]) + list(stores[: round_ % len(stores)])
        for name in names:
            for store in order:
                began = time.perf_counter()
                store.calls[name]()
                store.times.setdefault(name, []).append((time.perf_counter() - began) * 1000)


def server_ms(engine: Engine, statements: Sequence[Statement]) -> float:
    """Planning plus execution time the server reports for ``statements`` (rolled back)."""
    total = 0.0
    for statement in statements:
        samples = []
        for _ in range(EXPLAIN_REPEATS):
            with engine.connect() as connection:
                transaction = connection.begin()
                for setting in statement.settings:
                    connection.exec_driver_sql(setting)
                cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]
                cursor.execute(
                    "EXPLAIN (ANALYZE, FORMAT JSON) " + statement.sql, statement.parameters
                )
                top = cursor.fetchone()[0][0]
                transaction.rollback()
            samples.append(float(top["Planning Time"]) + float(top["Execution Time"]))
        total += statistics.median(samples)
    return total


def report(stores: Sequence[Store], server: dict[str, dict[str, float]]) -> list[str]:
    """A table: per operation, each store's median wall time and server time, and the ratio
    of the last store's median to the first's."""
    first, last = stores[0], stores[-1]
    head = " | ".join(f"{s.label} wall / server" for s in stores)
    lines = [f"| operation | {head} | wall {last.label} / {first.label} |", "|---|"]
    lines[1] += "---:|" * (len(stores) + 1)
    for name in first.calls:
        cells = []
        for store in stores:
            wall = statistics.median(store.times[name])
            cells.append(f"{wall:.2f} / {server[store.label].get(name, 0.0):.2f} ms")
        ratio = statistics.median(last.times[name]) / statistics.median(first.times[name])
        lines.append(f"| `{name}` | {' | '.join(cells)} | {ratio:.2f}x |")
    if len(stores) > 2:
        lines.append(f"(last column: {last.label} against {first.label})")
    return lines


def server_times(store: Store, names: Sequence[str]) -> dict[str, float]:
    """The server's time for each named operation's statements on ``store``."""
    found = {}
    for name in names:
        statements = statements_of(store.engine, store.calls[name])
        found[name] = server_ms(store.engine, statements)
    return found


def analyze(engine: Engine) -> None:
    """Fresh statistics, as autovacuum keeps them on a server left to itself."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("ANALYZE"))
