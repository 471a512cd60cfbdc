"""What every benchmark phase needs around it: environment, database, worker, broker, /proc.

Used by ``chain_vs_saga.py``; nothing here measures anything by itself.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BROKERS = {
    "rabbitmq": ("BENCH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//"),
    "redis": ("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
}
DEFAULT_STORE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


class BenchError(RuntimeError):
    pass


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds, self.end = seconds, time.monotonic() + seconds

    def check(self, what: str) -> None:
        if time.monotonic() > self.end:
            raise BenchError(f"benchmark exceeded --max-seconds={self.seconds:g} during {what}")


def configure_environment(run_id: str, broker: str, profile: bool) -> None:
    """Set what ``bench_app`` reads at import time (and the worker inherits)."""
    variable, default = BROKERS[broker]
    os.environ["BENCH_BROKER_URL"] = os.environ.get(variable) or default
    os.environ.setdefault("BENCH_STORE_URL", DEFAULT_STORE_URL)
    os.environ["BENCH_SCHEMA"] = f"celery_saga_bench_{run_id}"
    os.environ["BENCH_QUEUE"] = f"celery_saga_bench_{run_id}"
    os.environ["BENCH_PROFILE"] = "1" if profile else "0"
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise BenchError(f"{what} did not finish within {timeout:g}s")
        time.sleep(interval)


# --- database ------------------------------------------------------------------------------
#: The chain task's one write (``bench.write``), into a table made by ``create_writes_table``.
WRITE_SQL = "INSERT INTO {table} (run_id, batch, seq) VALUES (:r, :b, :s)"


def create_writes_table(connection: Any, table: str) -> None:
    """The chain's table: one row per task, found by run and by batch."""
    from sqlalchemy import text

    connection.execute(
        text(
            f"CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, "
            "run_id VARCHAR(64) NOT NULL, batch VARCHAR(64) NOT NULL, seq INTEGER NOT NULL, "
            "written_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
    )
    for name, columns in (("run", "run_id, seq"), ("batch", "batch, seq")):
        connection.execute(text(f"CREATE INDEX ix_{table}_{name} ON {table} ({columns})"))


def prepare_database(bench: Any) -> None:
    import bench_profile
    from sqlalchemy import text

    with bench.bench_db().begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{bench.SCHEMA}"'))
        create_writes_table(connection, bench.WRITES_TABLE)
        connection.execute(text(bench_profile.CREATE_TABLE))  # the counting phase needs it
    bench.engine.ensure_schema()  # saga store tables, inside the same private schema


def drop_schema(bench: Any) -> None:
    from sqlalchemy import text

    with bench.bench_db().begin() as connection:
        connection.execute(text(f'DROP SCHEMA IF EXISTS "{bench.SCHEMA}" CASCADE'))


#: The tables of a run's schema that a round leaves dead row versions in.
VACUUMED = ("saga_executions", "saga_steps", "saga_decisions", "bench_writes")


def vacuum(bench: Any) -> float:
    """``VACUUM ANALYZE`` the schema's tables, as autovacuum does between bursts on a
    default server (this one may run with it off); the seconds it took."""
    return vacuum_tables(bench.bench_db(), VACUUMED)


def vacuum_tables(engine: Any, tables: Sequence[str]) -> float:
    """``VACUUM ANALYZE`` each of ``tables`` through ``engine``; the seconds it took."""
    from sqlalchemy import text

    started = time.perf_counter()
    with engine.connect() as connection:
        connection = connection.execution_options(isolation_level="AUTOCOMMIT")
        for table in tables:
            connection.execute(text(f"VACUUM ANALYZE {table}"))
    return time.perf_counter() - started


def scalar(bench: Any, sql: str, **params: Any) -> Any:
    from sqlalchemy import text

    with bench.bench_db().connect() as connection:
        return connection.execute(text(sql), params).scalar()


def rows(bench: Any, sql: str, **params: Any) -> list[Any]:
    from sqlalchemy import text

    with bench.bench_db().connect() as connection:
        return list(connection.execute(text(sql), params))


# --- worker --------------------------------------------------------------------------------
class Worker:
    """One ``celery worker`` subprocess in its own session: prefork 2, prefetch 1, fair."""

    def __init__(self, bench: Any, name: str, profile: bool = False) -> None:
        self.bench, self.profile = bench, profile
        self.nodename = f"bench-{name}@localhost"
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in stop()
            prefix="celery-saga-bench-worker-", suffix=".log", delete=False
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopped = False

    def _command(self) -> list[str]:
        return [
            *(sys.executable, "-m", "celery", "-A", "bench_app", "worker"),
            *("--pool", "prefork", "--concurrency", "2", "--prefetch-multiplier", "1"),
            *("-O", "fair", "-Q", self.bench.QUEUE, "-n", self.nodename),
            *("--loglevel", os.environ.get("BENCH_WORKER_LOGLEVEL", "WARNING")),
            *("--without-gossip", "--without-mingle", "--without-heartbeat"),
        ]

    def start(self, ready_timeout: float = 60.0) -> Worker:
        env = os.environ.copy()
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
        env["BENCH_PROFILE"] = "1" if self.profile else "0"
        self.proc = subprocess.Popen(
            self._command(),
            cwd=HERE,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"worker exited with {self.proc.returncode}:\n{self.tail()}")
            replies = self.bench.app.control.ping(destination=[self.nodename], timeout=0.5)
            if any(self.nodename in reply for reply in replies):
                return self
            time.sleep(0.2)
        raise BenchError(f"worker not ready after {ready_timeout:g}s:\n{self.tail()}")

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise BenchError(f"worker died:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(Path(self.log.name).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no worker log)"

    def stop(self, keep_log: bool = False) -> None:
        """SIGTERM (warm shutdown), then SIGKILL of the whole session after 15 s."""
        if self.stopped:
            return
        self.stopped = True
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if proc is not None:
            # Pool children left behind by a worker that died on its own.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        self.log.close()
        if keep_log:
            print(f"worker log kept: {self.log.name}")
        else:
            with contextlib.suppress(OSError):
                os.unlink(self.log.name)


@contextlib.contextmanager
def running(worker: Worker, keep_log: bool = False) -> Iterator[Worker]:
    """Start ``worker``; stop it on the way out, showing its log's tail after a failure."""
    try:
        yield worker.start()
    except (BenchError, TimeoutError):
        print(f"--- last lines of the worker log ---\n{worker.tail()}", file=sys.stderr)
        raise
    finally:
        worker.stop(keep_log=keep_log)


def purge_queue(bench: Any) -> int:
    from kombu import Exchange, Queue

    with bench.app.connection_for_write() as connection:
        connection.ensure_connection(max_retries=3)
        channel = connection.channel()
        try:
            queue = Queue(bench.QUEUE, Exchange(bench.QUEUE), routing_key=bench.QUEUE)(channel)
            purged = queue.purge() or 0
            queue.delete()
            queue.exchange.delete()
            return int(purged)
        finally:
            channel.close()


# --- /proc ---------------------------------------------------------------------------------
def _stat(pid: int | str) -> tuple[str, list[str]] | None:
    """(command name, stat fields after the name) of process ``pid``; None if unreadable."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.index("(") + 1 : raw.rindex(")")], raw[raw.rindex(")") + 2 :].split()


def _proc_stats() -> list[tuple[str, list[str], int]]:
    """(command name, stat fields after the name, pid) of every readable process."""
    result = []
    for entry in os.listdir("/proc"):
        stat = _stat(entry) if entry.isdigit() else None
        if stat is not None:
            result.append((*stat, int(entry)))
    return result


def _cpu_seconds(fields: list[str]) -> float:
    # fields[0] = state, [2] = pgid, [11] = utime, [12] = stime
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds_of(pid: int) -> float | None:
    """CPU seconds process ``pid`` used so far; None if it is not on this host."""
    stat = _stat(pid)
    return None if stat is None else _cpu_seconds(stat[1])


def process_cpu_seconds(worker_pid: int | None) -> dict[str, float]:
    """CPU seconds used so far by the worker's processes, PostgreSQL, the broker and this
    driver (Linux /proc; other users of the same servers are counted too)."""
    groups = {"worker": 0.0, "postgres": 0.0, "broker": 0.0}
    for name, fields, _pid in _proc_stats():
        cpu = _cpu_seconds(fields)
        if worker_pid is not None and int(fields[2]) == worker_pid:
            groups["worker"] += cpu
        elif name.startswith("postgres"):
            groups["postgres"] += cpu
        elif name.startswith(("beam.smp", "redis-server")):
            groups["broker"] += cpu
    own = os.times()
    groups["driver"] = own.user + own.system
    return groups


#: The groups ``process_cpu_seconds`` reports, in the order they are printed.
CPU_GROUPS = ("worker", "postgres", "broker", "driver")


def cpu_ms_per(before: dict[str, float], after: dict[str, float], count: int) -> dict[str, float]:
    """CPU milliseconds per unit (step or run) of each group between two readings."""
    return {group: (after[group] - before[group]) * 1000 / count for group in CPU_GROUPS}


def cpu_means(rounds: Sequence[dict[str, float]], prefix: str = "") -> str:
    """Each group's mean over ``rounds`` (keys ``<prefix><group>``), on one line."""
    means = (sum(r[prefix + g] for r in rounds) / len(rounds) for g in CPU_GROUPS)
    return "  ".join(f"{g} {m:6.2f}" for g, m in zip(CPU_GROUPS, means, strict=True))


def worker_rss_mb(worker_pid: int) -> dict[str, float]:
    """Resident memory of the worker's session: the main process and each pool process."""
    page = os.sysconf("SC_PAGE_SIZE")
    main, pool = 0.0, []
    for _name, fields, pid in _proc_stats():
        if int(fields[2]) != worker_pid:
            continue
        rss = int(fields[21]) * page / 2**20  # field 24 of stat: rss in pages
        if pid == worker_pid:
            main = rss
        else:
            pool.append(rss)
    return {"main": main, "pool_max": max(pool, default=0.0), "total": main + sum(pool)}


# --- environment report --------------------------------------------------------------------
def loadavg() -> str:
    try:
        return " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        return "n/a"


def version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "n/a"


def broker_version(bench: Any) -> str:
    with contextlib.suppress(Exception), bench.app.connection_for_read() as connection:
        connection.ensure_connection(max_retries=1)
        if connection.transport.driver_type == "redis":
            info = connection.default_channel.client.info("server")
            return f"redis {info.get('redis_version', 'n/a')}"
        properties = getattr(connection.connection, "server_properties", {}) or {}
        value = properties.get("version", "n/a")
        return f"rabbitmq {value.decode() if isinstance(value, bytes) else value}"
    return "n/a"


def print_environment(bench: Any, broker: str) -> None:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    print(f"== machine (broker {broker})")
    print(
        f"  cpu_count={os.cpu_count()}  usable_cpus={affinity}  "
        f"platform={platform.platform()}  python={platform.python_version()}  "
        f"load average at start={loadavg()}"
    )
    names = ("celery-saga-engine", "celery", "kombu", "redis", "SQLAlchemy", "psycopg")
    print("  " + "  ".join(f"{name}={version(name)}" for name in names))
    postgres = scalar(bench, "SHOW server_version")
    autovacuum = scalar(bench, "SHOW autovacuum")
    print(f"  postgresql={postgres} (autovacuum={autovacuum})  broker={broker_version(bench)}")
    print("== setup")
    print(
        "  a `celery worker` per phase: prefork --concurrency 2 --prefetch-multiplier 1 -O fair,"
        " no events, no gossip/mingle/heartbeat"
    )
    print(
        f"  chain : {bench.STEPS_PER_RUN} x bench.write (1 INSERT each, one commit); done = "
        "marker row of the last task (no result backend)"
    )
    print(f"  saga  : {bench.SAGA_NAME}, {bench.STEPS_PER_RUN} no-op steps, PostgreSQL store")
    print(
        f"  unwind: {bench.UNWIND_NAME}, 4 no-op steps with no-op compensations, the 5th fails:"
        " 4 reversals, ends `failed`"
    )
    print(
        "  chain_unwind: 4 x bench.write, then bench.fail (INSERT, raise) whose link_error runs"
        " a chain of 4 x bench.write; done = the last one's row"
    )
    print(f"  queue={bench.QUEUE}  schema={bench.SCHEMA}")
