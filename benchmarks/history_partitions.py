"""An experiment, not the store's schema: retention by dropping whole partitions (issue 26).

``partition(engine, first_day, days, width)`` turns a fresh, empty PostgreSQL store into one
whose run table and the five tables keyed by a run's id are partitioned by a range of that
id: one partition every ``width`` days from ``first_day`` (a version-7 id starts with its
millisecond, so a day's runs have ids in one range), and a default partition for every
other id (random or given ones). A primary key that does not hold the id (``saga_steps``,
``saga_history``) gets it added, as PostgreSQL asks of a partitioned table. The engine runs
on it unchanged.

``drop_days(engine, cutoff, runs, spread)`` retires the oldest partitions whose runs are
all terminal and older than ``cutoff``, until at least ``runs`` runs are gone: the tables
keyed by the run first, then the runs, each ``DROP TABLE`` in a transaction of its own with a
short lock timeout (a drop takes an exclusive lock on the parent table, for as long as the
detach checks the foreign keys into the partition, and must not queue the live statements
behind a long reader). The keyed partitions and the runs' go in separate transactions: a
failure between them leaves runs without their steps (an experiment's shortcut). Each
partition keeps its table's storage settings (the runs' fillfactor) and extended
statistics. The drops are spread over ``spread`` seconds, so that a live stream beside them
meets them; the report gives the seconds the drops themselves took (lock waits included,
not the check of what a partition holds). What the experiment leaves out: a partition with
an unfinished run or a child run in another partition, and the archive (a drop is final).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import OperationalError

from celery_saga.store.database import to_db_time

RUNS = "saga_executions"
#: The tables keyed by a run's id, dropped before the runs they reference.
KEYED = ("saga_steps", "saga_history", "saga_decisions", "saga_signals", "saga_version_waits")
#: A drop that cannot get its lock this many times in a row gives up (something holds it).
LOCK_TRIES = 200


def _bound(day: datetime) -> str:
    """The smallest version-7 id text of ``day``'s first millisecond."""
    hex12 = f"{int(day.timestamp() * 1000):012x}"
    return f"{hex12[:8]}-{hex12[8:]}"


def _storage(connection: Connection, table: str) -> tuple[str, list[str]]:
    """``table``'s storage settings as a WITH clause ('' for none), and its extended
    statistics' DDL with ``{table}`` and ``{name}`` left to fill in per partition."""
    options = connection.execute(
        text("SELECT reloptions FROM pg_class WHERE oid = CAST(:t AS regclass)"), {"t": table}
    ).scalar_one()
    statistics = connection.execute(
        text(
            "SELECT stxname, pg_get_statisticsobjdef(oid) FROM pg_statistic_ext "
            "WHERE stxrelid = CAST(:t AS regclass)"
        ),
        {"t": table},
    ).all()
    made = [
        definition.replace(f"public.{name} ", "{name} ").rsplit(" FROM ", 1)[0] + " FROM {table}"
        for name, definition in statistics
    ]
    return (f" WITH ({', '.join(options)})" if options else ""), made


def _definitions(connection: Connection, table: str) -> tuple[list[str], list[str], list[str]]:
    """(index DDL, key constraint DDL, foreign key DDL) of ``table`` as it stands."""
    indexes = connection.execute(
        text(
            "SELECT indexdef FROM pg_indexes i WHERE tablename = :t AND NOT EXISTS "
            "(SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname)"
        ),
        {"t": table},
    ).scalars()
    constraints = connection.execute(
        text(
            "SELECT contype, conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = CAST(:t AS regclass) AND contype IN ('p', 'u', 'f')"
        ),
        {"t": table},
    ).all()
    key = "id" if table == RUNS else "execution_id"
    keys, foreign = [], []
    for kind, name, definition in constraints:
        if kind == "f":
            foreign.append(f"ALTER TABLE {table} ADD CONSTRAINT {name} {definition}")
            continue
        if key not in definition.split("(", 1)[1]:
            definition = definition.replace(")", f", {key})", 1)
        keys.append(f"ALTER TABLE {table} ADD CONSTRAINT {name} {definition}")
    return list(indexes), keys, foreign


def partition(engine: Engine, first_day: datetime, days: int, width: int = 1) -> None:
    """The store at ``engine`` (schema made, no rows) partitioned by run id, ``width``
    days of runs a partition."""
    tables = (RUNS, *KEYED)
    with engine.begin() as connection:
        found = {table: _definitions(connection, table) for table in tables}
        storage = {table: _storage(connection, table) for table in tables}
        for table in tables:
            key = "id" if table == RUNS else "execution_id"
            connection.execute(text(f"ALTER TABLE {table} RENAME TO {table}_flat"))
            connection.execute(
                text(
                    f"CREATE TABLE {table} (LIKE {table}_flat INCLUDING DEFAULTS) "
                    f"PARTITION BY RANGE ({key})"
                )
            )
            for sequence in connection.execute(
                text(
                    "SELECT s.relname FROM pg_class s JOIN pg_depend d ON d.objid = s.oid "
                    "WHERE s.relkind = 'S' AND d.refobjid = CAST(:t AS regclass)"
                ),
                {"t": f"{table}_flat"},
            ).scalars():
                connection.execute(text(f"ALTER SEQUENCE {sequence} OWNED BY NONE"))
        for table in reversed(tables):
            connection.execute(text(f"DROP TABLE {table}_flat CASCADE"))
        for table in tables:
            _days(connection, table, (first_day, days, width), storage[table])
            indexes, keys, _ = found[table]
            for statement in (*keys, *indexes):
                connection.execute(text(statement))
        for table in tables:
            for statement in found[table][2]:
                connection.execute(text(statement))


def _days(
    connection: Connection,
    table: str,
    span: tuple[datetime, int, int],
    storage: tuple[str, list[str]],
) -> None:
    """``table``'s partitions: ``span`` is (first day, days, days a partition)."""
    first, days, width = span
    options, statistics = storage
    names = []
    for day in range(0, days, width):
        low, high = (_bound(first + timedelta(days=day + k)) for k in (0, width))
        names.append(f"{table}_d{day:04}")
        bounds = f"FOR VALUES FROM ('{low}') TO ('{high}')"
        connection.execute(text(f"CREATE TABLE {names[-1]} PARTITION OF {table} {bounds}{options}"))
    names.append(f"{table}_default")
    connection.execute(text(f"CREATE TABLE {names[-1]} PARTITION OF {table} DEFAULT{options}"))
    for name in (table, *names):  # the parent's for plans across partitions
        for statement in statistics:
            connection.execute(text(statement.format(table=name, name=f"st_{name}")))


def _day_partitions(connection: Connection) -> list[str]:
    """The partitions of the runs by range (not the default one), oldest first."""
    return list(
        connection.execute(
            text(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                f"WHERE i.inhparent = CAST('{RUNS}' AS regclass) "
                "AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT' ORDER BY c.relname"
            ),
        ).scalars()
    )


#: A partition's runs that stop it from being dropped: unfinished, or too recent.
_KEEPS = (
    "SELECT count(*) FILTER (WHERE NOT (state IN ('completed', 'cancelled') OR "
    "(state = 'failed' AND rollback_status IS NOT NULL)) OR updated_at > :cutoff), count(*) "
    "FROM {day}"
)


def _drop(engine: Engine, table: str) -> float:
    """``DROP TABLE table``, retried until it gets its lock; the seconds it took. A partition
    of runs is detached first: the foreign keys into it are checked (no row refers to it)."""
    began = time.perf_counter()
    parent = table.rsplit("_", 1)[0]
    for attempt in range(LOCK_TRIES):
        try:
            with engine.begin() as connection:
                connection.execute(text("SET LOCAL lock_timeout = '50ms'"))
                if parent == RUNS:
                    connection.execute(text(f"ALTER TABLE {RUNS} DETACH PARTITION {table}"))
                connection.execute(text(f"DROP TABLE IF EXISTS {table}"))
            return time.perf_counter() - began
        except OperationalError:  # the lock timed out behind a live statement: again
            if attempt == LOCK_TRIES - 1:
                raise
            time.sleep(0.01)
    raise AssertionError("unreachable")


def drop_days(engine: Engine, cutoff: datetime, runs: int, spread: float) -> str:
    """Drop the oldest whole partitions until ``runs`` runs are gone (see the module)."""
    with engine.connect() as connection:
        days = _day_partitions(connection)
    gone, work, dropped, began = 0, 0.0, 0, time.monotonic()
    for day in days:
        if gone >= runs:
            break
        with engine.connect() as connection:
            kept, count = connection.execute(
                text(_KEEPS.format(day=day)), {"cutoff": to_db_time(cutoff)}
            ).one()
        if kept:
            break
        pause = spread * min(count, runs) / max(runs, 1) / 2  # drops amid the stream
        time.sleep(pause)
        suffix = day.removeprefix(RUNS)
        work += sum(_drop(engine, f"{table}{suffix}") for table in (*KEYED, RUNS))
        gone, dropped = gone + count, dropped + 1
        time.sleep(pause)
    rate = gone / max(work, 1e-9)
    return (
        f"dropped {dropped} partition(s), {gone} runs, in {work * 1000:.0f} ms of drops "
        f"({rate:,.0f} runs/s of drop time), spread over {time.monotonic() - began:.1f} s"
    )
