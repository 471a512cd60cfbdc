"""A PostgreSQL server of a test's own, to crash for real (``pg_ctl stop -m immediate``).

An immediate stop is what a host crash or the OOM killer does to the server: no checkpoint,
and commits that were not yet flushed to the WAL (``synchronous_commit = off``) are gone
when it starts again. The shared test server cannot be crashed, so a test that needs this
makes a cluster in a temporary folder (``initdb``), on a port of its own. As root (CI), the
server runs as the ``postgres`` user, which PostgreSQL requires.
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


class OwnCluster:
    """``initdb`` in a temporary folder, started on a free port; ``crash()`` stops it at
    once."""

    def __init__(self) -> None:
        bindir = _bindir()
        assert bindir is not None, available()
        # Not under pytest's folder: the server's user must be able to reach it.
        self.bindir, self.folder = bindir, Path(tempfile.mkdtemp(prefix="saga-pg-"))
        self.data, self.log = self.folder / "data", self.folder / "server.log"
        self.port = free_port()
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.start()
        admin = create_engine(self.url("postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.execute(text("CREATE DATABASE store"))
        admin.dispose()

    def url(self, database: str = "store") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, program: str, *arguments: str) -> None:
        command = [str(self.bindir / program), *arguments]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, cwd=self.folder)

    def start(self) -> None:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.log), "-w", "start")

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
