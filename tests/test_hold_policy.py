"""The failure policy (issue 42): checked where it is given, resolved step over saga, and
never a hold for a parallel group's member."""

from __future__ import annotations

from datetime import timedelta

import pytest

from celery_saga import Saga, step
from celery_saga.definition.failure_policy import FailurePolicy, resolve
from celery_saga.errors import DefinitionError


def _work() -> None:
    return None


@pytest.mark.parametrize("bad", ["halt", "HOLD", 1, True])
def test_an_unknown_policy_is_refused_naming_it(bad: object) -> None:
    with pytest.raises(DefinitionError, match=r"step 'a': on_failure= takes 'unwind' or 'hold'"):
        step("a", _work, on_failure=bad)  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match=r"saga 's': on_failure= takes"):
        Saga("s", on_failure=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1, "1h", True, timedelta(0)])
def test_a_hold_timeout_must_be_a_positive_duration(bad: object) -> None:
    with pytest.raises(DefinitionError, match="hold_timeout= takes a positive number"):
        step("a", _work, on_failure="hold", hold_timeout=bad)  # type: ignore[arg-type]


def test_a_hold_timeout_without_a_hold_is_refused() -> None:
    with pytest.raises(DefinitionError, match="only with on_failure='hold'"):
        step("a", _work, on_failure="unwind", hold_timeout=5)


def test_a_parallel_member_cannot_hold() -> None:
    with pytest.raises(DefinitionError, match="'p1' of parallel group 'g' cannot hold"):
        Saga("s").parallel("g", step("p1", _work, on_failure="hold"), step("p2", _work))


def test_the_step_policy_wins_over_the_saga_default_and_a_group_never_holds() -> None:
    assert resolve(None, None, None, None, in_group=False) == FailurePolicy()
    assert resolve(None, None, "hold", 60.0, in_group=False) == FailurePolicy(True, 60.0)
    assert resolve("hold", 5.0, "hold", 60.0, in_group=False) == FailurePolicy(True, 5.0)
    assert resolve("unwind", None, "hold", 60.0, in_group=False) == FailurePolicy()
    assert resolve(None, None, "hold", None, in_group=True) == FailurePolicy()


def test_a_sealed_saga_resolves_each_steps_policy() -> None:
    definition = (
        Saga("s", on_failure="hold", hold_timeout=timedelta(minutes=10))
        .step("a", _work)
        .step("b", _work, on_failure="unwind")
        .parallel("g", step("p", _work))
        .seal()
    )
    a, b = definition.find_step("a"), definition.find_step("b")
    assert a is not None and b is not None
    assert definition.failure_policy(a, 0) == FailurePolicy(True, 600.0)
    assert definition.failure_policy(b, 1) == FailurePolicy()
    p = definition.find_step("p")
    assert p is not None
    assert definition.failure_policy(p, 2) == FailurePolicy()
