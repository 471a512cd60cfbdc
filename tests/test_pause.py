"""Issue 42, pausing a step for everyone: a run that reaches a paused step is held at its
door before its body starts (a message already queued included), no worker slot waits for
it, and ``unpause`` releases the held runs at the rate asked, each once; refusals store
nothing."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner, Result

from celery_saga import ExecutionState, InvalidStateError, Saga, SagaEngine, SagaError, get_clock
from celery_saga.cli import saga
from celery_saga.errors import UnknownSagaError
from celery_saga.records import Attempt
from celery_saga.store import claims, forward, history, pauses
from celery_saga.worker import pause_moves, run_commands
from tests.conftest import Harness, unconsumed_app
from tests.paused_sagas import started_at
from tests.test_version_hand_on import _sent


def _wait(harness: Harness, ids: list[str], done: Any, within: float = 60) -> list[Any]:
    ends = time.monotonic() + within
    while True:
        runs = [harness.engine.get(i) for i in ids]
        if all(done(run) for run in runs):
            return runs
        if time.monotonic() > ends:
            states = sorted({run.state.value for run in runs})
            raise AssertionError(f"runs still {states}\n{harness.worker_logs()}")
        time.sleep(0.1)


def _settled(run: Any) -> bool:
    return run.state in (ExecutionState.COMPLETED, ExecutionState.HELD)


def _charges(harness: Harness, run_id: str) -> list[Any]:
    entries = harness.test_app.entries(run_id)
    return [e for e in entries if e.step == "charge" and e.direction == "forward"]


@pytest.fixture
def unpaused(harness: Harness) -> Any:
    """Every test leaves no pause behind (the harness's store is shared by the tests)."""
    yield harness
    for stored in harness.engine.pauses():
        harness.engine.unpause(stored.saga, stored.step)


def test_a_run_reaching_a_paused_step_is_held_at_its_door_and_unpause_runs_it_once(
    unpaused: Harness,
) -> None:
    harness = unpaused
    harness.engine.pause("paused_order", "charge", reason="provider down", actor="ops@example")
    run = harness.start("paused_order", {"order": 1})
    (held,) = _wait(harness, [run.id], lambda r: r.state is ExecutionState.HELD)
    assert held.failure_reason == "paused: provider down"
    assert held.step("reserve").status.value == "completed"
    assert _charges(harness, run.id) == [], "no body of the paused step started"
    rows = [r for r in history.load(harness.engine.db, run.id) if r.kind == "paused"]
    assert [(r.step, r.actor, r.detail) for r in rows] == [
        ("charge", "ops@example", "provider down")
    ]
    (listed,) = harness.engine.pauses()
    assert (listed.saga, listed.step, listed.reason, listed.held) == (
        "paused_order",
        "charge",
        "provider down",
        1,
    )
    lifted = harness.engine.unpause("paused_order", "charge", actor="ops@example", reason="back")
    assert lifted.released == 1 and lifted.pause is not None
    (done,) = _wait(harness, [run.id], lambda r: r.state is ExecutionState.COMPLETED)
    assert len(_charges(harness, done.id)) == 1
    rows = [r for r in history.load(harness.engine.db, run.id) if r.kind == "unpaused"]
    assert [(r.actor, r.detail) for r in rows] == [("ops@example", "back")]
    again = harness.engine.unpause("paused_order", "charge")
    assert (again.pause, again.released) == (None, 0), "run again, it releases nothing twice"
    assert harness.engine.pauses() == []


def test_a_whole_saga_pause_holds_at_the_next_step_and_never_a_group_member_alone(
    unpaused: Harness,
) -> None:
    harness = unpaused
    plan = {"reserve": {"mark_begin": True, "sleep": 0.5}}
    run = harness.start("paused_group", {"order": 2, "plan": plan})
    ends = time.monotonic() + 30
    while not harness.test_app.entries(run.id):  # reserve began: the pause meets the group
        assert time.monotonic() < ends, harness.worker_logs()
        time.sleep(0.02)
    harness.engine.pause("paused_group", reason="maintenance")
    (held,) = _wait(harness, [run.id], lambda r: r.state is ExecutionState.HELD)
    assert held.failure_reason == "paused: maintenance"
    assert held.step("email").status.value == "completed", "the group ran and settled"
    assert held.step("sms").status.value == "completed"
    assert _charges(harness, run.id) == []
    assert harness.engine.unpause("paused_group").released == 1
    _wait(harness, [run.id], lambda r: r.state is ExecutionState.COMPLETED)
    assert len(_charges(harness, run.id)) == 1


def test_unpause_leaves_a_run_held_by_its_failure_held(unpaused: Harness) -> None:
    harness = unpaused
    switch = f"down-{uuid.uuid4().hex}"
    harness.test_app.set_switch(switch, True)
    failing = harness.start("held_order", {"order": 3, "down": switch})
    _wait(harness, [failing.id], lambda r: r.state is ExecutionState.HELD)
    harness.engine.pause("held_order", "charge", reason="provider down")
    assert harness.engine.unpause("held_order", "charge").released == 0
    time.sleep(0.5)
    still = harness.engine.get(failing.id)
    assert still.state is ExecutionState.HELD
    assert still.failure_reason.startswith("ConnectionError")
    harness.test_app.set_switch(switch, False)
    harness.engine.cancel(failing.id, "test over")


def test_an_unpause_interrupted_and_run_again_releases_each_run_once(unpaused: Harness) -> None:
    harness = unpaused
    harness.engine.pause("paused_order", "charge", reason="provider down")
    ids = [harness.start("paused_order", {"order": n}).id for n in range(6)]
    _wait(harness, ids, lambda r: r.state is ExecutionState.HELD)

    def interrupt(count: int) -> None:
        if count == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _unpause_with(harness, interrupt)
    assert harness.engine.pauses() == [], "the pause went first"
    assert harness.engine.unpause("paused_order", "charge").released == 4
    runs = _wait(harness, ids, lambda r: r.state is ExecutionState.COMPLETED)
    assert [len(_charges(harness, run.id)) for run in runs] == [1] * 6
    for run in runs:
        kinds = [r.kind for r in history.load(harness.engine.db, run.id)]
        assert kinds.count("unpaused") == 1, kinds


def _unpause_with(harness: Harness, progress: Any) -> Any:
    return pause_moves.unpause(
        harness.engine.parts,
        "paused_order",
        "charge",
        rate=None,
        actor=None,
        reason=None,
        progress=progress,
    )


def _invoke(harness: Harness, *args: str) -> Result:
    obj = SimpleNamespace(app=harness.test_app.app)
    return CliRunner().invoke(saga, list(args), obj=obj, catch_exceptions=False)


def test_the_cli_pauses_lists_and_unpauses_and_show_says_why_a_run_is_held(
    unpaused: Harness,
) -> None:
    harness = unpaused
    dry = _invoke(
        harness, "pause", "paused_order", "--step", "charge", "--reason", "x", "--dry-run"
    )
    assert "dry run: would pause paused_order.charge" in dry.output, dry.output
    assert harness.engine.pauses() == [], "a dry run stores nothing"
    paused = _invoke(harness, "pause", "paused_order", "--step", "charge", "--reason", "down")
    assert paused.exit_code == 0, paused.output
    assert "paused paused_order.charge" in paused.output
    run = harness.start("paused_order", {"order": 7})
    _wait(harness, [run.id], lambda r: r.state is ExecutionState.HELD)
    listed = _invoke(harness, "pauses").output
    assert "paused_order.charge" in listed and "down" in listed and "(1 held)" in listed
    shown = _invoke(harness, "show", run.id).output
    assert "held: paused (down) at the door of step 'charge'" in shown, shown
    for refused, names in (
        (("pause", "paused_order", "--step", "nope", "--reason", "x"), "no step named 'nope'"),
        (("unpause", "paused_order", "--step", "charge", "--rate", "fast"), "not a rate"),
        (("unpause", "paused_order", "--step", "charge", "--rate", "0/s"), "above zero"),
    ):
        result = _invoke(harness, *refused)
        assert result.exit_code == 1 and names in result.output, result.output
    assert [p.held for p in harness.engine.pauses()] == [1], "the refusals changed nothing"
    dry = _invoke(harness, "unpause", "paused_order", "--step", "charge", "--dry-run")
    assert "would unpause paused_order.charge and release 1 held run(s)" in dry.output
    assert [p.held for p in harness.engine.pauses()] == [1], "a dry run releases nothing"
    released = _invoke(harness, "unpause", "paused_order", "--step", "charge", "--rate", "50/s")
    assert "unpaused paused_order.charge; released 1 held run(s)" in released.output
    _wait(harness, [run.id], lambda r: r.state is ExecutionState.COMPLETED)
    assert _invoke(harness, "pauses").output.strip() == "nothing is paused"


@pytest.mark.parametrize(
    ("saga", "step", "reason", "error", "names"),
    [
        ("no_such_saga", None, "why", UnknownSagaError, "no_such_saga"),
        ("paused_order", "no_such_step", "why", SagaError, "no_such_step"),
        ("paused_order", "charge", "", SagaError, "reason"),
        ("paused_order", "charge", "  ", SagaError, "reason"),
        ("paused_group", "email", "why", SagaError, "parallel group 'notify'"),
    ],
)
def test_a_refused_pause_names_the_problem_and_stores_nothing(
    unpaused: Harness, saga: str, step: str | None, reason: str, error: type, names: str
) -> None:
    harness = unpaused
    with pytest.raises(error, match=names):
        harness.engine.pause(saga, step, reason=reason)
    assert harness.engine.pauses() == []


def test_a_second_pause_of_the_same_step_is_refused_naming_the_first(unpaused: Harness) -> None:
    harness = unpaused
    harness.engine.pause("paused_order", "charge", reason="first", actor="ann")
    with pytest.raises(InvalidStateError, match=r"paused already .*by ann: first"):
        harness.engine.pause("paused_order", "charge", reason="second")
    assert [p.reason for p in harness.engine.pauses()] == ["first"]
    with pytest.raises(SagaError, match="no step named 'nope'"):
        harness.engine.unpause("paused_order", "nope")
    assert [p.reason for p in harness.engine.pauses()] == ["first"]


def test_pause_during_a_flood_starts_no_body_after_it_and_unpause_keeps_the_rate(
    unpaused: Harness,
) -> None:
    """200 runs; the pause lands while they flow: no body of ``charge`` starts after the
    pause is stored, the held runs keep no worker busy, and ``unpause --rate 20/s``
    releases them 20 a second (+-20%), after which every run completes, charged once."""
    harness = unpaused
    if harness.in_process:
        pytest.skip("needs real prefork workers (inspect active)")
    data = {"charge_sleep": 0.02, "plan": {"reserve": {"sleep": 0.02}}}
    ids = [harness.start("paused_order", {**data, "order": n}).id for n in range(200)]
    ends = time.monotonic() + 60
    while sum(bool(_charges(harness, i)) for i in ids[:60]) < 15:
        assert time.monotonic() < ends, harness.worker_logs()
        time.sleep(0.05)
    harness.engine.pause("paused_order", "charge", reason="provider down")
    stored = time.time()
    runs = _wait(harness, ids, _settled, within=120)
    held = [run.id for run in runs if run.state is ExecutionState.HELD]
    # The claim's own statement reads the pause: no claim is granted once it is stored, so
    # every ``charge`` record was claimed before; a body whose claim was granted before it
    # may begin a few milliseconds after (its worker was between its claim and its body).
    claimed = [
        run.step("charge").started_at.timestamp()
        for run in (harness.engine.get(i) for i in ids)
        if run.state is ExecutionState.COMPLETED
    ]
    assert max(claimed) <= stored, f"a claim granted {max(claimed) - stored:.3f}s after"
    late = [
        started_at(row.detail) - stored
        for i in ids
        for row in _charges(harness, i)
        if started_at(row.detail) > stored
    ]
    assert max(late, default=0) < 0.25, f"bodies began long after the pause: {late}"
    assert len(held) >= 60, f"only {len(held)} runs held: the pause landed late"
    assert all(harness.engine.get(i).failure_reason == "paused: provider down" for i in held)
    active = harness.test_app.app.control.inspect(timeout=2.0).active() or {}
    queue = harness.test_app.app.conf.task_default_queue
    busy = [task for name, tasks in active.items() if queue in name for task in tasks]
    assert busy == [], f"worker slots busy while the runs are held: {busy}"

    lifted = harness.engine.unpause("paused_order", "charge", rate=20.0, actor="ops")
    assert lifted.released == len(held)
    times = sorted(
        row.at.timestamp()
        for i in held
        for row in history.load(harness.engine.db, i)
        if row.kind == "unpaused"
    )
    measured = (len(times) - 1) / (times[-1] - times[0])
    assert 16.0 <= measured <= 24.0, f"released at {measured:.1f}/s, asked 20/s"
    done = _wait(harness, ids, lambda r: r.state is ExecutionState.COMPLETED, within=120)
    assert [len(_charges(harness, run.id)) for run in done] == [1] * 200
    print(
        f"\nflood: {len(held)} held, {len(late)} bodies began after the pause ({late}) "
        f"of claims before it; released at {measured:.2f}/s"
    )


def test_a_run_held_at_a_paused_door_refuses_retry_and_can_be_cancelled(
    unpaused: Harness,
) -> None:
    harness = unpaused
    harness.engine.pause("paused_order", "charge", reason="provider down")
    run = harness.start("paused_order", {"order": 9})
    _wait(harness, [run.id], lambda r: r.state is ExecutionState.HELD)
    with pytest.raises(InvalidStateError, match=r"paused step .*unpause releases it"):
        harness.engine.retry(run.id)
    assert harness.engine.get(run.id).state is ExecutionState.HELD, "the refusal stored nothing"
    harness.engine.cancel(run.id, "order withdrawn")
    (ended,) = _wait(harness, [run.id], lambda r: r.state is ExecutionState.CANCELLED)
    assert [p.held for p in harness.engine.pauses()] == [0], "a cancelled run is not held"
    assert harness.engine.unpause("paused_order", "charge").released == 0
    assert _charges(harness, ended.id) == []
    assert harness.engine.get(run.id).state is ExecutionState.CANCELLED


def _store_only(tmp_path: Path) -> SagaEngine:
    engine = SagaEngine(unconsumed_app("pauses"), store_url=f"sqlite:///{tmp_path}/p.sqlite3")
    engine.register(Saga("order").step("a", lambda: None).step("b", lambda: None))
    engine.ensure_schema()
    return engine


def test_a_pause_whose_reply_was_lost_is_not_refused_when_retried(tmp_path: Path) -> None:
    engine = _store_only(tmp_path)
    now = get_clock().now()
    first = pauses.pause(engine.db, "order", "a", reason="down", actor="ann", now=now)
    again = pauses.pause(engine.db, "order", "a", reason="down", actor="ann", now=now)
    assert again == first, "the retry finds its own row"
    with pytest.raises(InvalidStateError, match="paused already"):
        pauses.pause(engine.db, "order", "a", reason="down", actor="ann", now=get_clock().now())


def test_a_release_whose_reply_was_lost_still_owes_the_steps_message(tmp_path: Path) -> None:
    engine = _store_only(tmp_path)
    engine.pause("order", "a", reason="down")
    run = engine.start("order", {})  # no worker: held as a worker would hold it
    now = get_clock().now()
    assert pauses.hold_at_door(engine.db, run.id, saga="order", step="a", node=0, sub=0, now=now)
    released = pauses.release(engine.db, run.id, now=now, actor="ops", reason=None)
    assert released is not None and released[1] is True
    retried = pauses.release(engine.db, run.id, now=now, actor="ops", reason=None)
    assert retried is not None and retried[1] is False, "landed: its message is sent again"
    kinds = [r.kind for r in history.load(engine.db, run.id)]
    assert kinds.count("unpaused") == 1, kinds
    with engine.db.transaction() as connection:  # the run moved on since
        history.note(connection, run.id, history.Kind.STEP_COMPLETED, get_clock().now())
    assert pauses.release(engine.db, run.id, now=now, actor="ops", reason=None) is None


def test_the_claim_refuses_a_paused_step_and_passes_once_released_on_every_store(
    store_url: str,
) -> None:
    """The claim's own statement reads the pause (PostgreSQL, MariaDB, SQLite): refused
    while paused, the first claim and a retry's alike; held, released, claimed."""
    engine, name, run = _one_step_run(store_url, "pause-claims")

    def claim(existing: Any = None) -> int | None:
        return _claim(engine, run, existing)

    engine.pause(name, reason="down", actor="o" * 300)  # kept to the width history keeps
    try:
        (stored,) = [p for p in engine.pauses() if p.saga == name]
        assert stored.actor == "o" * 200
        assert claim() is None, "the whole saga's pause refuses the first claim"
        assert engine.get(run.id).steps == (), "and nothing was written"
        now = get_clock().now()
        held = pauses.hold_at_door(engine.db, run.id, saga=name, step="a", node=0, sub=0, now=now)
        assert held is not None and held.step is None
        assert engine.get(run.id).failure_reason == "paused: down"
        assert pauses.held_by(engine.db, name, None, limit=10) == [run.id]
    finally:
        lifted = pauses.unpause(engine.db, name, None)
    assert lifted is not None and lifted.reason == "down"
    released = pauses.release(engine.db, run.id, now=get_clock().now(), actor=None, reason=None)
    assert released is not None and released[1] is True
    assert claim() == 1, "released, the step is claimed"
    first = Attempt(run.id, "a", 0, 0, 1, get_clock().now())
    assert claims.release(engine.db, first, reason="flaky", now=get_clock().now())
    engine.pause(name, "a", reason="down again")
    try:
        record = engine.get(run.id).step("a")
        assert claim(record) is None, "a retry's claim is refused alike"
        assert engine.get(run.id).step("a").attempts == 1
    finally:
        pauses.unpause(engine.db, name, "a")
    assert claim(record) == 2
    engine.db.dispose()


def test_a_hold_at_a_paused_door_and_its_release_are_announced(unpaused: Harness) -> None:
    harness = unpaused
    if not harness.in_process:
        pytest.skip("listens to the in-process worker's events")
    seen: list[tuple[str, dict[str, Any]]] = []

    def listen(event: str, fields: dict[str, Any]) -> None:
        if event in ("saga-held", "saga-unpaused"):
            seen.append((event, fields))

    harness.engine.on("*", listen)
    harness.engine.pause("paused_order", "charge", reason="provider down")
    run = harness.start("paused_order", {"order": 12})
    _wait(harness, [run.id], lambda r: r.state is ExecutionState.HELD)
    harness.engine.unpause("paused_order", "charge", actor="ops")
    _wait(harness, [run.id], lambda r: r.state is ExecutionState.COMPLETED)
    mine = [(e, f) for e, f in seen if f.get("execution_id") == run.id]
    assert [e for e, _ in mine] == ["saga-held", "saga-unpaused"]
    assert mine[0][1]["reason"] == "paused: provider down" and mine[0][1]["step"] == "charge"
    assert mine[1][1]["actor"] == "ops"


def test_a_pause_never_holds_a_run_under_a_live_claim_of_its_step(store_url: str) -> None:
    """A pause stored while the step's body runs: a late message's refused claim does not
    hold the run under the body (whose outcome could then not be written); once the
    claim's lease has run out (its worker died), the run is held."""
    engine, name, run = _one_step_run(store_url, "pause-live")
    now = get_clock().now()
    assert _claim(engine, run, lease=now + timedelta(seconds=60)) == 1
    engine.pause(name, "a", reason="down")
    try:
        door = {"saga": name, "step": "a", "node": 0, "sub": 0}
        assert pauses.hold_at_door(engine.db, run.id, **door, now=now) is None
        assert engine.get(run.id).state is ExecutionState.RUNNING, "nothing written"
        later = now + timedelta(seconds=61)
        assert pauses.hold_at_door(engine.db, run.id, **door, now=later) is not None
        assert engine.get(run.id).state is ExecutionState.HELD
    finally:
        pauses.unpause(engine.db, name, "a")
    engine.db.dispose()


def test_an_unpause_without_the_runs_version_hands_each_release_on(tmp_path: Path) -> None:
    """A process without a held run's version (a newer deploy) lifts the pause and hands
    the run's release on to a worker that has the version, which releases it once."""
    old_app, new_app = unconsumed_app("pause-hand-on"), unconsumed_app("pause-hand-on")
    new_app.conf.task_default_queue = old_app.conf.task_default_queue
    store = f"sqlite:///{tmp_path}/hand_on.sqlite3"
    old, new = SagaEngine(old_app, store_url=store), SagaEngine(new_app, store_url=store)
    old.register(Saga("order", version="1").step("a", lambda: None))
    new.register(Saga("order", version="2").step("a", lambda: None).step("b", lambda: None))
    run = old.start("order", {})
    old.pause("order", "a", reason="down")
    door = {"saga": "order", "step": "a", "node": 0, "sub": 0, "now": get_clock().now()}
    assert pauses.hold_at_door(old.db, run.id, **door) is not None
    _sent(old)
    assert new.unpause("order", "a", actor="ops").released == 1
    (message,) = _sent(new)
    execution_id, command, arguments = message.decode()[0]
    assert (execution_id, command) == (run.id, "release")
    assert new.get(run.id).state is ExecutionState.HELD, "released by the worker, not here"
    run_commands.carry_out(old.parts, execution_id, command, arguments)
    assert old.get(run.id).state is ExecutionState.RUNNING
    (sent,) = _sent(old)
    assert sent.headers["task"] == "order.a", "the step's message, sent again"
    run_commands.carry_out(old.parts, execution_id, command, arguments)
    kinds = [row.kind for row in history.load(old.db, run.id)]
    assert kinds.count("unpaused") == 1, "handed on twice, released once"
    # Nothing ran since: the step's message is owed again (a duplicate, refused by its claim).
    assert [m.headers["task"] for m in _sent(old)] == ["order.a"]


def _one_step_run(store_url: str, prefix: str) -> tuple[SagaEngine, str, Any]:
    """A store-only engine with a one-step saga of its own name, and a run of it that no
    worker moves (the claims are the test's)."""
    name = f"order_{uuid.uuid4().hex[:8]}"
    engine = SagaEngine(unconsumed_app(prefix), store_url=store_url)
    engine.register(Saga(name).step("a", lambda: None))
    engine.ensure_schema()
    return engine, name, engine.start(name, {})


def _claim(engine: SagaEngine, run: Any, existing: Any = None, lease: Any = None) -> int | None:
    """Claim step ``a`` of ``run`` as a worker does (``pause_step`` named)."""
    definition = engine.catalog.known(engine.get(run.id).record.saga_name)
    assert definition is not None
    return forward.claim_step(
        engine.db,
        execution_id=run.id,
        name="a",
        node=0,
        sub=0,
        definition_hash=definition.hash,
        idempotency_key=f"{run.id}:a",
        compensatable=False,
        lease_expires_at=lease,
        now=get_clock().now(),
        existing=existing,
        pause_step="a",
    )
