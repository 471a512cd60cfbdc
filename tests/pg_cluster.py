"""A PostgreSQL server of a test's own, to crash for real (``pg_ctl stop -m immediate``).

An immediate stop is what a host crash or the OOM killer does to the server: no checkpoint,
and commits that were not yet flushed to the WAL (``synchronous_commit = off``) are gone
when it starts again. The shared test server cannot be crashed, so a test that needs this
makes a cluster in a temporary folder (``initdb``), on a port of its own. As root (CI), the
server runs as the ``postgres`` user, which PostgreSQL requires.

``Standby`` is a streaming replica of such a cluster, for the reads off a replica: the
shared server lets no one connect for replication, a cluster of a test's own does.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine, text

from tests.faults import free_port


def _bindir() -> Path | None:
    found = shutil.which("pg_ctl")
    if found:
        return Path(os.path.realpath(found)).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(candidates[-1]).parent if candidates else None


def available() -> str | None:
    """None when a cluster can be made here, else why not."""
    if _bindir() is None:
        return "PostgreSQL's server programs (initdb, pg_ctl) are not installed"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser to start the server as postgres"
    return None


def _own_folder(prefix: str) -> Path:
    # Not under pytest's folder: the server's user must be able to reach it.
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
    return folder


def _run(bindir: Path, folder: Path, program: str, *arguments: str) -> None:
    command = [str(bindir / program), *arguments]
    if os.geteuid() == 0:
        command = ["runuser", "-u", "postgres", "--", *command]
    subprocess.run(command, check=True, capture_output=True, cwd=folder)


def _start(bindir: Path, folder: Path, port: int) -> None:
    """The server of ``folder/data`` on ``port``, its socket and log in ``folder``."""
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1"
    data, log = str(folder / "data"), str(folder / "server.log")
    _run(bindir, folder, "pg_ctl", "-D", data, "-o", options, "-l", log, "-w", "start")


class OwnCluster:
    """``initdb`` in a temporary folder, started on a free port; ``crash()`` stops it at
    once."""

    def __init__(self) -> None:
        bindir = _bindir()
        assert bindir is not None, available()
        self.bindir, self.folder = bindir, _own_folder("saga-pg-")
        self.data, self.log = self.folder / "data", self.folder / "server.log"
        self.port = free_port()
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.start()
        admin = create_engine(self.url("postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.execute(text("CREATE DATABASE store"))
        admin.dispose()

    def url(self, database: str = "store") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, program: str, *arguments: str) -> None:
        _run(self.bindir, self.folder, program, *arguments)

    def start(self) -> None:
        _start(self.bindir, self.folder, self.port)

    def crash(self) -> None:
        """Stop the server the way a crash does: no checkpoint, unflushed commits lost."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop")

    def restart_after(self, seconds: float) -> float:
        """Crash now, start again after ``seconds``; returns when it was back (monotonic)."""
        self.crash()
        time.sleep(seconds)
        self.start()
        return time.monotonic()

    def close(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # not running
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)


class Standby:
    """A streaming replica of ``primary``: ``pg_basebackup -R`` of its running server (whose
    ``initdb -A trust`` lets 127.0.0.1 connect for replication), started on a port of its
    own as a hot standby. ``pause()`` stops its replay (it still receives the WAL), which
    makes it lag for as long as a test wants."""

    def __init__(self, primary: OwnCluster) -> None:
        self.bindir, self.folder = primary.bindir, _own_folder("saga-pg-standby-")
        self.data, self.port = self.folder / "data", free_port()
        # A fast checkpoint: the default spreads it out and held the copy up for 95 s.
        self._run(
            "pg_basebackup",
            *("-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres"),
            *("-D", str(self.data), "-R", "-X", "stream", "--no-sync", "--checkpoint=fast"),
        )
        _start(self.bindir, self.folder, self.port)
        self.admin = create_engine(self.url("postgres"), isolation_level="AUTOCOMMIT")

    def url(self, database: str = "store") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, program: str, *arguments: str) -> None:
        _run(self.bindir, self.folder, program, *arguments)

    def _ask(self, statement: str) -> object:
        with self.admin.connect() as connection:
            return connection.execute(text(statement)).scalar()

    def pause(self) -> None:
        self._ask("SELECT pg_wal_replay_pause()")

    def resume(self) -> None:
        self._ask("SELECT pg_wal_replay_resume()")

    def received_unreplayed(self) -> bool:
        """WAL has arrived that is not replayed yet (the replica is behind)."""
        return bool(self._ask("SELECT pg_last_wal_receive_lsn() > pg_last_wal_replay_lsn()"))

    def close(self) -> None:
        self.admin.dispose()
        with contextlib.suppress(subprocess.CalledProcessError):  # not running
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)
