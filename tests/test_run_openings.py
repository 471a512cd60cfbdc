"""Where ``saga_runs_started`` counts a run: the event that says a worker took its first
node, once per run (the first attempt's claim is taken once), whatever that node is."""

from __future__ import annotations

from typing import Any

from celery_saga import Saga, path, step
from celery_saga.decisions.openings import Opening, opening, opens_run


def _fwd(ctx: Any) -> None:
    return None


def _of(saga: Saga) -> Opening:
    return opening(saga.seal().nodes)


def _started(step_name: str, attempt: int = 1) -> tuple[str, dict[str, Any]]:
    return "saga-step-started", {"saga": "s", "step": step_name, "attempt": attempt}


def test_only_the_first_attempt_of_the_first_step_opens_a_run() -> None:
    first = _of(Saga("s").step("a", _fwd).step("b", _fwd))
    assert opens_run([first], *_started("a"))
    assert not opens_run([first], *_started("a", attempt=2))  # a retry or a takeover
    assert not opens_run([first], *_started("b"))
    assert not opens_run([first], "saga-started", {"saga": "s"})  # the producer's event


def test_a_first_group_opens_with_its_first_member_alone() -> None:
    group = _of(Saga("s").parallel("g", step("m1", _fwd), step("m2", _fwd)))
    assert opens_run([group], *_started("m1"))
    assert not opens_run([group], *_started("m2"))


def test_a_first_branch_opens_with_the_first_step_of_whichever_path_it_takes() -> None:
    branch = _of(
        Saga("s").branch(
            "size",
            lambda ctx: "big",
            path("big", step("review", _fwd), step("approve", _fwd)),
            path("small", step("auto", _fwd)),
        )
    )
    assert branch.records == {"review", "auto"}


def test_first_loops_open_with_their_first_iteration() -> None:
    each = _of(Saga("s").for_each(lambda ctx: [1, 2], step("pack", _fwd)))
    until = _of(Saga("s").do_until(lambda ctx: True, step("poll", _fwd), max_iterations=3))
    assert (each.records, until.records) == ({"pack:0"}, {"poll:0"})
    assert not opens_run([each], *_started("pack:1"))


def test_a_pivot_first_is_passed_over_and_a_gate_first_opens_when_the_run_parks_there() -> None:
    assert _of(Saga("s").pivot().step("a", _fwd)).records == {"a"}
    gate = _of(Saga("s").wait_for("approved").step("a", _fwd))
    assert opens_run([gate], "saga-waiting", {"saga": "s", "event": "approved"})
    assert not opens_run([gate], *_started("a"))


def test_every_known_version_of_a_saga_is_asked() -> None:
    old, new = _of(Saga("s").step("a", _fwd)), _of(Saga("s").step("z", _fwd).step("a", _fwd))
    assert opens_run([old, new], *_started("z")) and opens_run([old, new], *_started("a"))
