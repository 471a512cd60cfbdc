"""Retention catch-up variants, each beside the same live stream (issue 26).

Fills one PostgreSQL database with ``--runs`` finished five-step runs (``history_fill.py``),
then runs ``--variants`` one after the other, each retiring ``--retire-runs`` runs, between
two quiet stretches of live five-step runs started at ``--live-rate`` per second on a real
worker (``history_live.py``). Alternate the variants (``current chunked current chunked``)
so that each meets the same machine; the stream's p95 during each, against the quiet
stretches, is what the variant costs live runs. The database is dropped at the end.

A variant is ``KIND[:REST][/BATCH][+SETTING]`` (BATCH runs a batch, default ``--batch``):

``current``   the catch-up as ``retention.retire`` runs it, resting REST (default
              ``retention.REST``) times each batch's duration: archive, then cleanup.
``archive``   the archive alone; ``cleanup``: the cleanup alone.
``chunked``   each batch's archive and delete in chunks of ``--chunk`` runs, resting REST
              times each chunk's duration inside the batch's transaction.
``async``     the current catch-up, its batches committed without waiting for their WAL
              flush (``SET LOCAL synchronous_commit = off``).
``process``   the current catch-up in a process of its own (the stream's process is not
              where a worker would run it).
``packed``    an experiment, not the store's archive: the archive as one row per run in a
              table of the benchmark's own (``bench_packed_archive``: the run's id, when,
              and its row, steps, history rows, signals and decisions as one ``jsonb``),
              then the cleanup as ``current``. What a packed archive would cost.
``idle``      nothing for ``--spread`` seconds: the stream's own noise, beside the rest.
``dropped``   an experiment, with ``--partitioned``: the oldest whole partitions of runs
              dropped (``history_partitions.py``), spread over ``--spread`` seconds.

``--partitioned`` partitions the store's run tables by run id before the fill, a partition
every ``--partition-days`` days of runs (an experiment: what retiring whole partitions would
cost; the engine runs on it unchanged).

``--ids random`` fills the store and starts the live runs with random ids (version 4, as the
engine made them before version 7): what time-ordered ids save. ``--prearchive N`` archives N
runs flat out, before the stream starts, so that the variants meet an archive of that size.

``+wal8g`` (``max_wal_size = 8GB``) or ``+lz4`` (``wal_compression = lz4``) sets the server
with ``ALTER SYSTEM`` for the variant and resets it after: it needs a superuser, and it
changes the server for everything else running on it meanwhile.

    python benchmarks/history_variants.py --runs 1000000 --retire-runs 40000 \\
        --variants current chunked current chunked
    python benchmarks/history_variants.py --variants archive cleanup archive cleanup cleanup:0
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import history
import history_fill
import history_live
import history_partitions
from sqlalchemy import Connection, create_engine, delete, text

from celery_saga import SagaEngine
from celery_saga.store import history as history_rows
from celery_saga.store import retention
from celery_saga.store.tables import executions
from celery_saga.worker import run_commands

SETTINGS = {"wal8g": ("max_wal_size", "'8GB'"), "lz4": ("wal_compression", "'lz4'")}
KINDS = (
    "current",
    "archive",
    "cleanup",
    "chunked",
    "async",
    "process",
    "packed",
    "idle",
    "dropped",
)
PACKED = "bench_packed_archive"


def _chunked(chunk: int, rest: float) -> Callable[..., Any]:
    """``retention._retire_once`` with its work in chunks, resting inside the transaction."""

    def retire_once(*args: Any, replace: bool, actor: str | None) -> tuple[list[Any], list[str]]:
        db, cutoff, now, archive, batch, position = args
        with db.transaction() as connection:
            began = time.perf_counter()
            roots = retention._claim_candidates(connection, cutoff, batch, position)
            ids = retention._families(connection, [root for _, root in roots])
            for start in range(0, len(ids), chunk):
                chunk_ids = ids[start : start + chunk]
                _retire_ids(connection, chunk_ids, (cutoff, now), archive, replace, actor)
                time.sleep((time.perf_counter() - began) * rest)
                began = time.perf_counter()
        return roots, ids

    return retire_once


def _asynchronous(*args: Any, replace: bool, actor: str | None) -> tuple[list[Any], list[str]]:
    """``retention._retire_once``, committing without waiting for the WAL's flush."""
    db, cutoff, now, archive, batch, position = args
    with db.transaction() as connection:
        connection.execute(text("SET LOCAL synchronous_commit = off"))
        roots = retention._claim_candidates(connection, cutoff, batch, position)
        ids = retention._families(connection, [root for _, root in roots])
        if ids:
            _retire_ids(connection, ids, (cutoff, now), archive, replace, actor)
    return roots, ids


def _copy_packed(connection: Connection, ids: Sequence[str], now: datetime, _: bool) -> None:
    """``retention._copy_to_archive``, each run copied as one packed row (``PACKED``)."""
    connection.execute(_PACK, {"ids": list(ids), "now": now})


def _rows_of(table: str) -> str:
    return f"(SELECT jsonb_agg(to_jsonb(r)) FROM {table} r WHERE r.execution_id = e.id)"


_PACK = text(
    f"INSERT INTO {PACKED} (id, archived_at, body) "
    "SELECT e.id, :now, jsonb_build_object('run', to_jsonb(e), "
    f"'steps', {_rows_of('saga_steps')}, 'history', {_rows_of('saga_history')}, "
    f"'signals', {_rows_of('saga_signals')}, 'decisions', {_rows_of('saga_decisions')}) "
    "FROM saga_executions e WHERE e.id = ANY(:ids)"
)


def _create_packed(engine: SagaEngine) -> None:
    with engine.db.engine.begin() as connection:
        connection.execute(
            text(
                f"CREATE TABLE IF NOT EXISTS {PACKED} (id varchar(64) PRIMARY KEY, "
                "archived_at timestamp NOT NULL, body jsonb NOT NULL)"
            )
        )


def _retire_ids(
    connection: Connection,
    ids: Sequence[str],
    when: tuple[datetime, datetime],
    archive: bool,
    replace: bool,
    actor: str | None,
) -> None:
    """As ``retention._retire_once`` does, for ``when`` (cutoff, now)."""
    cutoff, now = when
    if archive:
        why = retention.archived_because(cutoff)
        retention._copy_to_archive(connection, ids, now, replace)
        history_rows.write_archived(connection, ids, now, actor, why)
    connection.execute(delete(executions).where(executions.c.id.in_(ids)))


@contextmanager
def _server_setting(admin_url: str, name: str | None) -> Iterator[None]:
    """The server set as ``SETTINGS[name]`` while the block runs (nothing for None)."""
    if name is None:
        yield
        return
    key, value = SETTINGS[name]
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f"ALTER SYSTEM SET {key} = {value}"))
            connection.execute(text("SELECT pg_reload_conf()"))
        yield
    finally:
        with admin.connect() as connection:
            connection.execute(text(f"ALTER SYSTEM RESET {key}"))
            connection.execute(text("SELECT pg_reload_conf()"))
        admin.dispose()


def _ids(kind: str) -> AbstractContextManager[object]:
    """The engine's new run ids as ``--ids`` says (random: version 4, as before version 7)."""
    if kind == "ordered":
        return nullcontext()
    return mock.patch.object(run_commands, "new_execution_id", lambda: str(uuid.uuid4()))


def parse(variant: str) -> tuple[str, float, int | None, str | None]:
    """``KIND[:REST][/BATCH][+SETTING]`` -> (kind, rest, batch or None, setting)."""
    spec, _, setting = variant.partition("+")
    spec, _, batch = spec.partition("/")
    kind, _, rest = spec.partition(":")
    if (
        kind not in KINDS
        or (setting and setting not in SETTINGS)
        or (batch and not batch.isdigit())
    ):
        raise SystemExit(f"unknown variant {variant!r}: KIND[:REST][/BATCH][+SETTING], see --help")
    rest_of = float(rest) if rest else retention.REST
    return kind, rest_of, int(batch) if batch else None, setting or None


def run_variant(engine: SagaEngine, args: argparse.Namespace, variant: str) -> list[str]:
    """Retire ``--retire-runs`` runs (each way the variant says); its report lines."""
    kind, rest, batch, _ = parse(variant)
    cutoff = datetime.now(UTC) - timedelta(days=1)
    if kind == "idle":
        time.sleep(args.spread)
        return [f"nothing for {args.spread:g} s"]
    if kind == "dropped":
        return [
            history_partitions.drop_days(engine.db.engine, cutoff, args.retire_runs, args.spread)
        ]
    replacement: Any = retention._retire_once
    if kind == "chunked":
        replacement, rest = _chunked(args.chunk, rest), 0.0  # it rests inside its batches
    elif kind == "async":
        replacement = _asynchronous
    copy: Any = retention._copy_to_archive
    if kind == "packed":
        _create_packed(engine)
        copy = _copy_packed
    ways = {"archive": (True,), "cleanup": (False,)}.get(kind, (True, False))
    with (
        mock.patch.object(retention, "_retire_once", replacement),
        mock.patch.object(retention, "_copy_to_archive", copy),
    ):
        return [
            history._retire(engine, cutoff, args.retire_runs, way, rest, batch or args.batch)
            for way in ways
        ]


def _in_a_process(args: argparse.Namespace, url: str, variant: str) -> list[str]:
    command = [sys.executable, __file__, "--child-of", url, "--variants", variant]
    command += ["--retire-runs", str(args.retire_runs), "--batch", str(args.batch)]
    out = subprocess.run(command, check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()


def _phases(
    engine: SagaEngine, args: argparse.Namespace, url: str
) -> dict[str, Callable[[], list[str]]]:
    def phase(variant: str) -> list[str]:
        kind, _, _, setting = parse(variant)
        with _server_setting(args.admin_url, setting):
            if kind == "process":
                return _in_a_process(args, url, variant.replace("process", "current", 1))
            return run_variant(engine, args, variant)

    return {
        f"{index + 1}, {variant}": functools.partial(phase, variant)
        for index, variant in enumerate(args.variants)
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--admin-url", default=os.environ.get("BENCH_ADMIN_URL", history.DEFAULT_ADMIN_URL)
    )
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--retire-runs", type=int, default=40_000)
    parser.add_argument("--variants", nargs="+", default=["current", "chunked"] * 2)
    parser.add_argument("--batch", type=int, default=history.BATCH)
    parser.add_argument("--chunk", type=int, default=100)
    parser.add_argument("--live-rate", type=float, default=10.0)
    parser.add_argument("--live-seconds", type=float, default=30.0)
    parser.add_argument("--ids", choices=sorted(history_fill.IDS), default="ordered")
    parser.add_argument("--prearchive", type=int, default=0)
    parser.add_argument("--partitioned", action="store_true")
    parser.add_argument("--partition-days", type=int, default=1)
    parser.add_argument("--spread", type=float, default=30.0)
    parser.add_argument("--child-of", help=argparse.SUPPRESS)  # a ``process`` variant's child
    args = parser.parse_args()
    for variant in args.variants:
        if parse(variant)[0] == "dropped" and not args.partitioned:
            raise SystemExit(f"{variant!r} drops partitions: it needs --partitioned")
    if args.partition_days < 1:
        raise SystemExit("--partition-days: at least 1")
    if args.child_of:
        engine, _ = history._store(args.child_of, argparse.Namespace(without_index=[]))
        print("\n".join(run_variant(engine, args, args.variants[0])))
        return 0
    name = f"saga_history_variants_{uuid.uuid4().hex[:6]}"
    admin = create_engine(args.admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f"CREATE DATABASE {name}"))
    url = args.admin_url.rsplit("/", 1)[0] + "/" + name
    try:
        engine, bulk = history._store(url, argparse.Namespace(without_index=[]))
        now = datetime.now(UTC)
        if args.partitioned:
            first = now - timedelta(days=history_fill.SPREAD_DAYS + 1)
            first = first.replace(hour=0, minute=0, second=0, microsecond=0)
            days = history_fill.SPREAD_DAYS + 4
            history_partitions.partition(bulk, first, days, args.partition_days)
        seconds = history_fill.fill(bulk, args.runs, 2000, 200, 20, now, args.ids)
        history_fill.vacuum(bulk)
        print(f"filled {args.runs:,} finished runs ({args.ids} ids) in {seconds:.1f} s", flush=True)
        if args.prearchive:
            cutoff = now - timedelta(days=1)
            print(
                "before: "
                + history._retire(engine, cutoff, args.prearchive, True, 0.0, args.batch),
                flush=True,
            )
            history_fill.vacuum(bulk)
        bulk.dispose()
        with admin.connect() as connection:
            buffers = connection.execute(text("SHOW shared_buffers")).scalar_one()
        print(f"server: shared_buffers {buffers} (the catch-up's cost depends on it)", flush=True)
        phases = _phases(engine, args, url)
        with _ids(args.ids):
            for line in history_live.beside(url, args.live_rate, args.live_seconds, phases):
                print(line, flush=True)
        engine.db.dispose()
    finally:
        with admin.connect() as connection:
            connection.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
        admin.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
