"""Guarantee 22's hand-backs at the pace they log, with real ``celery worker`` processes on
RabbitMQ and on Redis, with PostgreSQL.

A rolling deploy before any new worker has started: two old workers (version 1 only)
consume the queue while runs of version 2 wait there. ``rollout``'s first step is a task the
old workers do not have; ``deploy``'s first step is a task they have, for another version.
For ``SAGA_TEST_HAND_BACK_SECONDS`` each message goes back once per step of its backoff, at
the pace its line says, with one WARNING line per step and one store write per message (the
first marking); then a worker with version 2 starts and every run moves within one
countdown. The suite runs a 20 s window; ``docs/deploying.md`` gives a 60 s run's figures.
"""

from __future__ import annotations

import itertools
import os
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import text

from celery_saga import ExecutionState
from celery_saga.decisions.hand_back import SPREAD
from celery_saga.decisions.versions import HAND_BACK_COUNTDOWNS, hand_back_countdown
from tests.conftest import BROKERS, PORTS, _test_database_url, require_services
from tests.deploy_rig import DeployRig
from tests.test_crash_recovery import wait_for

#: How long the old workers meet the new runs alone (60 for the issue's own check).
WINDOW = float(os.environ.get("SAGA_TEST_HAND_BACK_SECONDS", "20"))
#: How late a message may come back after the pause its line named (a loaded CI host).
LATE = 2.0
#: A hand-back's WARNING line: when, which run and task, its count and the pause it names.
LINE = re.compile(
    r"^\[(?P<at>[\d-]+ [\d:,]+): WARNING/\S+\] execution (?P<run>\S+?):? .*; message "
    r"(?P<task>\S+) handed back \((?P<times>\d+)\) for .*, offered again in (?P<wait>[\d.]+) s$"
)

_COUNT_WRITES = """
CREATE TABLE IF NOT EXISTS test_saga_writes (tbl text, op text, execution_id text);
CREATE OR REPLACE FUNCTION test_count_saga_write() RETURNS trigger AS $$
DECLARE r jsonb;
BEGIN
  IF TG_OP = 'DELETE' THEN r := to_jsonb(OLD); ELSE r := to_jsonb(NEW); END IF;
  INSERT INTO test_saga_writes VALUES
    (TG_TABLE_NAME, TG_OP, coalesce(r->>'execution_id', r->>'id'));
  RETURN NULL;
END $$ LANGUAGE plpgsql;
"""
_TABLES = (
    "saga_executions",
    "saga_steps",
    "saga_history",
    "saga_decisions",
    "saga_signals",
    "saga_version_waits",
)


@pytest.fixture(params=["postgres-rabbitmq", "postgres-redis"])
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DeployRig]:
    require_services(PORTS["postgres"], PORTS[request.param])
    rig = DeployRig(BROKERS[request.param], _test_database_url(), tmp_path)
    try:
        yield rig
    finally:
        rig.close()


@pytest.fixture
def counting_writes(rig: DeployRig) -> Iterator[None]:
    """Every row written to the saga tables is counted (``counted`` reads and resets)."""
    with rig.client.db.engine.begin() as connection:
        connection.execute(text(_COUNT_WRITES))
        connection.execute(text("TRUNCATE test_saga_writes"))
        for table in _TABLES:
            connection.execute(
                text(
                    f"CREATE OR REPLACE TRIGGER test_count_saga_write AFTER INSERT OR UPDATE "
                    f"OR DELETE ON {table} FOR EACH ROW EXECUTE FUNCTION test_count_saga_write()"
                )
            )
    yield
    with rig.client.db.engine.begin() as connection:
        for table in _TABLES:
            connection.execute(text(f"DROP TRIGGER IF EXISTS test_count_saga_write ON {table}"))


def counted(rig: DeployRig) -> Counter[tuple[str, str]]:
    with rig.client.db.engine.begin() as connection:
        rows = connection.execute(text("SELECT execution_id, tbl FROM test_saga_writes")).all()
        connection.execute(text("TRUNCATE test_saga_writes"))
    return Counter((r[0], r[1]) for r in rows)


def steps_within(seconds: float, factor: float) -> int:
    """How many hand-backs of one message fit in ``seconds`` after its first one, each
    pause its step of the backoff times ``factor``."""
    steps, spent = 1, 0.0
    while spent + hand_back_countdown(steps - 1) * factor <= seconds:
        spent += hand_back_countdown(steps - 1) * factor
        steps += 1
    return steps


def hand_back_lines(
    rig: DeployRig, *names: str
) -> dict[tuple[str, str], list[tuple[float, int, float]]]:
    """(run, task) -> its hand-backs as (time, count, pause named), from every log."""
    found: dict[tuple[str, str], list[tuple[float, int, float]]] = defaultdict(list)
    for name in names:
        for line in rig.log(name).splitlines():
            match = LINE.match(line)
            if match:
                at = datetime.strptime(match["at"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                key = (match["run"], match["task"])
                found[key].append((at, int(match["times"]), float(match["wait"])))
    return {key: sorted(lines, key=lambda line: line[1]) for key, lines in found.items()}


def check_pace(run: str, handed: list[tuple[float, int, float]], until: float) -> int:
    """One line per step of the backoff, each step as long as the line before said (its
    countdown, spread by up to ``SPREAD``); returns how many steps fit at most."""
    times = [count for _, count, _ in handed]
    most = steps_within(until - handed[0][0], 1 - SPREAD)
    assert len(times) <= most, f"{run}: {len(times)} hand-backs logged where {most} steps fit"
    assert times == list(range(1, len(times) + 1)), f"{run}: counts {times[:12]}"
    least = steps_within(until - handed[0][0], 1 + SPREAD) - 1
    assert len(times) >= least, f"{run}: {len(times)} hand-backs where {least} steps fit"
    for (at, count, wait), (again, _, _) in itertools.pairwise(handed):
        countdown = hand_back_countdown(count - 1)
        assert countdown * (1 - SPREAD) - 0.01 <= wait <= countdown * (1 + SPREAD) + 0.01
        assert wait - 0.02 <= again - at <= wait + LATE, (run, count, wait, again - at)
    return most


@pytest.mark.usefixtures("counting_writes")
def test_old_workers_hand_back_at_the_pace_they_log_then_a_new_worker_takes_the_runs(
    rig: DeployRig,
) -> None:
    newest = rig.clients["2"]
    first_task = {"rollout": "rollout.vet", "deploy": "deploy.reserve"}
    runs = {newest.start(saga, {"n": n}).id: saga for saga in first_task for n in range(3)}
    counted(rig)  # the starts' own writes: from here on, only what the workers write
    rig.start_worker("old-a", "1")
    rig.start_worker("old-b", "1")
    time.sleep(WINDOW)
    ended = time.time()
    written = counted(rig)
    lines = hand_back_lines(rig, "old-a", "old-b")

    assert set(lines) == {(run, first_task[saga]) for run, saga in runs.items()}, lines.keys()
    for (run, task), handed in lines.items():
        fit = check_pace(run, handed, ended)
        mine = {table: n for (key, table), n in written.items() if key == run}
        print(f"{task}: {len(handed)} lines, {fit} steps fit, store writes {mine}")
        assert mine == {"saga_version_waits": 1}, "marked once, at its first hand-back"
        assert rig.client.get(run).waiting_for_version == newest.definition(runs[run]).hash
        assert not rig.client.get(run).steps, "no body ran on another version"

    rig.start_worker("new", "1,2")
    started = time.monotonic()
    took = moved_on(rig, runs, started)
    print(
        f"after the new worker started (s): first steps ran {took['first']}, runs {took['moved']}"
    )
    countdown = HAND_BACK_COUNTDOWNS[-1]
    assert max(took["first"]) <= countdown + LATE, f"a waiting step ran {took} s after the start"
    # The old workers still consume the queue: the runs' next messages may meet them too,
    # each then back within a short step of the backoff (the new worker has arrived).
    assert max(took["moved"]) <= 3 * countdown, f"the runs moved on {took} s after the start"


def moved_on(rig: DeployRig, runs: dict[str, str], started: float) -> dict[str, list[float]]:
    """Seconds after ``started`` at which each run's waiting first step ran, and at which
    the run got as far as it goes (``rollout``: completed; ``deploy``: its gate)."""
    first_step = {"rollout": "vet", "deploy": "reserve"}
    done = {"rollout": ExecutionState.COMPLETED, "deploy": ExecutionState.WAITING}
    first: dict[str, float] = {}
    moved: dict[str, float] = {}
    deadline = started + 60
    while len(moved) < len(runs) and time.monotonic() < deadline:
        for run, saga in runs.items():
            execution = rig.client.get(run)
            at = round(time.monotonic() - started, 1)
            if run not in first and any(s.name == first_step[saga] for s in execution.steps):
                first[run] = at
            if run not in moved and execution.state is done[saga]:
                moved[run] = at
        time.sleep(0.1)
    assert len(moved) == len(runs), f"runs still waiting a minute after the start: {moved}"
    return {"first": sorted(first.values()), "moved": sorted(moved.values())}


def test_a_held_message_goes_back_at_once_when_its_worker_stops(rig: DeployRig) -> None:
    """A worker holds the message it hands back unacknowledged: stopped (a warm shutdown,
    as a deploy stops it), it leaves the message to the broker at once, and the next worker
    that can run it does not wait for the rest of the pause."""
    rig.start_worker("old", "1")
    run = rig.clients["2"].start("rollout", {}).id
    wait_for(  # its fifth hand-back: a pause of 6 to 10 s
        lambda: "handed back (5) for a worker that has it" in rig.log("old"),
        timeout=30,
    )
    rig.stop_worker("old")
    rig.start_worker("new", "1,2")
    started = time.monotonic()
    wait_for(lambda: rig.client.get(run).state is ExecutionState.COMPLETED, timeout=30)
    took = time.monotonic() - started
    assert took < 3, f"the run waited {took:.1f} s for a message its stopped worker held"
    assert [s.name for s in rig.client.get(run).steps] == ["vet", "apply"]
    assert not [k for k, n in rig.ledger_keys().items() if n > 1], "no body ran twice"
