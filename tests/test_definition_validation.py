"""Guarantee 24 (definition side): a malformed saga is refused with a ``DefinitionError`` that
names the saga and the offending step (or group, branch or path), and changes nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import celery
import pytest

from celery_saga import DefinitionError, Saga, compensated_by, path, step


def charge(amount: int) -> int:
    return amount


def refund(amount: int) -> int:
    return -amount


def ship(address: str = "here") -> str:
    return address


def unship() -> None:
    return None


def fast_or_slow(ctx: Any) -> str:
    return "fast"


def refused(build: Callable[[], Any], *names: str) -> DefinitionError:
    """Run ``build``; it must raise DefinitionError whose message quotes every name."""
    with pytest.raises(DefinitionError) as caught:
        build()
    message = str(caught.value)
    for name in names:
        assert repr(name) in message, f"{name!r} missing from {message!r}"
    return caught.value


# -- the saga as a whole ---------------------------------------------------------------


def test_saga_without_any_step_is_refused_naming_the_saga() -> None:
    refused(lambda: Saga("order").seal(), "order")


def test_saga_with_only_a_pivot_has_no_steps_and_is_refused() -> None:
    refused(lambda: Saga("order").pivot().seal(), "order")


@pytest.mark.parametrize("name", ["", "   ", None, 3])
def test_saga_name_must_be_a_non_empty_string(name: Any) -> None:
    with pytest.raises(DefinitionError):
        Saga(name)


def test_two_pivots_are_refused_naming_the_saga() -> None:
    saga = Saga("order").step("charge", charge).pivot().step("ship", ship).pivot()
    error = refused(saga.seal, "order")
    assert "pivot" in str(error)


# -- duplicate names -------------------------------------------------------------------


def test_duplicate_sequential_step_name_is_refused_naming_saga_and_step() -> None:
    saga = Saga("order").step("charge", charge).step("charge", refund)
    refused(saga.seal, "order", "charge")


def test_duplicate_name_between_parallel_members_is_refused() -> None:
    saga = Saga("order").parallel("prepare", step("pack", ship), step("pack", unship))
    refused(saga.seal, "order", "pack")


def test_parallel_member_reusing_an_earlier_step_name_is_refused() -> None:
    saga = (
        Saga("order")
        .step("charge", charge)
        .parallel("prepare", step("pack", ship), step("charge", unship))
    )
    refused(saga.seal, "order", "charge")


def test_same_step_name_on_two_branch_paths_is_refused() -> None:
    saga = Saga("order").branch(
        "route",
        fast_or_slow,
        path("fast", step("ship", ship)),
        path("slow", step("ship", unship)),
    )
    refused(saga.seal, "order", "ship")


def test_branch_path_step_reusing_an_earlier_step_name_is_refused() -> None:
    saga = (
        Saga("order")
        .step("ship", ship)
        .branch("route", fast_or_slow, path("fast", step("ship", unship)))
    )
    refused(saga.seal, "order", "ship")


def test_map_transform_reusing_a_step_name_is_refused() -> None:
    saga = Saga("order").step("charge", charge).map("charge", lambda ctx: ctx)
    refused(saga.seal, "order", "charge")


def test_duplicate_path_names_in_one_branch_are_refused_naming_branch_and_path() -> None:
    refused(
        lambda: Saga("order").branch(
            "route",
            fast_or_slow,
            path("fast", step("a", ship)),
            path("fast", step("b", unship)),
        ),
        "order",
        "route",
        "fast",
    )


# -- reserved names --------------------------------------------------------------------

RESERVED = ["input", "results", "signals", "__private", "__dunder__", "charge:1", "charge:007"]


@pytest.mark.parametrize("name", RESERVED)
def test_reserved_step_name_is_refused_as_a_sequential_step(name: str) -> None:
    refused(lambda: Saga("order").step(name, charge), "order", name)


@pytest.mark.parametrize("name", RESERVED)
def test_reserved_step_name_is_refused_as_a_parallel_member(name: str) -> None:
    refused(lambda: Saga("order").parallel("group", step(name, charge)), "order", name)


@pytest.mark.parametrize("name", RESERVED)
def test_reserved_step_name_is_refused_on_a_branch_path(name: str) -> None:
    refused(
        lambda: Saga("order").branch("route", fast_or_slow, path("fast", step(name, charge))),
        "order",
        name,
    )


@pytest.mark.parametrize("name", RESERVED)
def test_reserved_name_is_refused_for_a_map_transform(name: str) -> None:
    refused(lambda: Saga("order").map(name, lambda ctx: ctx), "order", name)


@pytest.mark.parametrize("name", ["charge:extra", "charge:1x", "in:put", "_single", "inputs"])
def test_names_that_only_resemble_reserved_ones_are_allowed(name: str) -> None:
    definition = Saga("order").step(name, charge).seal()
    assert definition.find_step(name) is not None


@pytest.mark.parametrize("name", ["", "  ", None, 5])
def test_step_without_a_usable_name_is_refused_naming_the_saga(name: Any) -> None:
    refused(lambda: Saga("order").step(name, charge), "order")


# -- attempts, timeouts and backoff ----------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, 1.5, 2.0, "2", True, None])
def test_retry_that_is_not_an_integer_of_at_least_one_is_refused(value: Any) -> None:
    error = refused(lambda: Saga("order").step("charge", charge, retry=value), "order", "charge")
    assert "retry" in str(error)


@pytest.mark.parametrize("value", [0, -2, 0.5, True])
def test_compensation_retry_below_one_or_not_an_integer_is_refused(value: Any) -> None:
    error = refused(
        lambda: Saga("order").step("charge", charge, compensate=refund, compensation_retry=value),
        "order",
        "charge",
    )
    assert "compensation_retry" in str(error)


@pytest.mark.parametrize("field", ["timeout", "compensation_timeout", "backoff", "backoff_max"])
@pytest.mark.parametrize("value", [0, 0.0, -1, -0.001, "5", True])
def test_zero_negative_or_non_numeric_durations_are_refused(field: str, value: Any) -> None:
    error = refused(
        lambda: Saga("order").step("charge", charge, compensate=refund, **{field: value}),
        "order",
        "charge",
    )
    assert field in str(error)


@pytest.mark.parametrize("value", [0.001, 1, 2.5, None])
def test_positive_or_absent_timeouts_are_accepted(value: Any) -> None:
    definition = (
        Saga("order")
        .step("charge", charge, compensate=refund, timeout=value, compensation_timeout=value)
        .seal()
    )
    assert definition.find_step("charge").timeout == value  # type: ignore[union-attr]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e300])
def test_non_finite_timeout_is_refused_at_definition(value: float) -> None:
    refused(lambda: Saga("order").step("charge", charge, timeout=value), "order", "charge")


# -- callables -------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["tasks.charge", 42, None, {"run": charge}])
def test_non_callable_action_is_refused_naming_saga_and_step(action: Any) -> None:
    refused(lambda: Saga("order").step("charge", action), "order", "charge")


@pytest.mark.parametrize("compensation", ["tasks.refund", 42, ["refund"]])
def test_non_callable_compensation_is_refused_naming_saga_and_step(compensation: Any) -> None:
    error = refused(
        lambda: Saga("order").step("charge", charge, compensate=compensation), "order", "charge"
    )
    assert "compensation" in str(error)


def test_non_callable_compensation_in_a_parallel_member_is_refused() -> None:
    refused(
        lambda: Saga("order").parallel("group", step("pack", ship, compensate="unship")),
        "order",
        "pack",
    )


@pytest.mark.parametrize("field", ["args", "compensation_args"])
def test_non_callable_argument_mapper_is_refused(field: str) -> None:
    error = refused(
        lambda: Saga("order").step("charge", charge, compensate=refund, **{field: {"a": 1}}),
        "order",
        "charge",
    )
    assert field in str(error)


# -- branches and parallel groups ------------------------------------------------------


def test_branch_with_no_paths_is_refused_naming_saga_and_branch() -> None:
    saga = Saga("order").step("charge", charge).branch("route", fast_or_slow)
    refused(saga.seal, "order", "route")


def test_branch_path_with_no_steps_is_refused_naming_saga_branch_and_path() -> None:
    saga = (
        Saga("order")
        .step("charge", charge)
        .branch("route", fast_or_slow, path("fast", step("ship", ship)), path("slow"))
    )
    refused(saga.seal, "order", "route", "slow")


def test_branch_with_a_non_callable_selector_is_refused() -> None:
    saga = Saga("order").branch("route", "fast", path("fast", step("ship", ship)))  # type: ignore[arg-type]
    refused(saga.seal, "order", "route")


def test_parallel_group_with_no_steps_is_refused_naming_saga_and_group() -> None:
    saga = Saga("order").step("charge", charge).parallel("prepare")
    refused(saga.seal, "order", "prepare")


# -- sealing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "modify",
    [
        lambda saga: saga.step("ship", ship),
        lambda saga: saga.parallel("group", step("ship", ship)),
        lambda saga: saga.branch("route", fast_or_slow, path("fast", step("ship", ship))),
        lambda saga: saga.map("total", lambda ctx: ctx),
        lambda saga: saga.pivot(),
    ],
    ids=["step", "parallel", "branch", "map", "pivot"],
)
def test_modifying_a_sealed_saga_is_refused_and_changes_nothing(
    modify: Callable[[Saga], Any],
) -> None:
    saga = Saga("order").step("charge", charge, compensate=refund)
    definition = saga.seal()
    error = refused(lambda: modify(saga), "order")
    assert "sealed" in str(error)
    assert saga.seal() is definition
    assert len(definition.nodes) == 1
    assert definition.find_step("ship") is None


def test_sealing_twice_returns_the_same_definition() -> None:
    saga = Saga("order").step("charge", charge)
    assert saga.seal() is saga.seal()


def test_a_refused_step_is_not_added_to_the_saga() -> None:
    saga = Saga("order").step("charge", charge)
    refused(lambda: saga.step("input", ship), "order", "input")
    refused(lambda: saga.step("ship", ship, retry=0), "order", "ship")
    definition = saga.seal()
    assert len(definition.nodes) == 1
    assert definition.find_step("ship") is None


# -- compensated_by and Celery tasks ---------------------------------------------------


@pytest.fixture
def app() -> Iterator[celery.Celery]:
    application = celery.Celery("t", set_as_current=False)
    yield application
    application.close()


@pytest.fixture
def tasks(app: celery.Celery) -> dict[str, Any]:
    @app.task(name="t.payments.refund_card", shared=False)
    def refund_card(amount: int) -> str:
        return f"refunded {amount}"

    @app.task(name="t.payments.void_card", shared=False)
    def void_card(amount: int) -> str:
        return f"voided {amount}"

    @compensated_by(refund_card)
    @app.task(name="t.payments.charge_card", shared=False)
    def charge_card(amount: int, currency: str = "EUR") -> str:
        return f"charged {amount} {currency}"

    return {"charge": charge_card, "refund": refund_card, "void": void_card}


def test_compensated_by_attaches_a_default_compensation_that_step_picks_up(
    tasks: dict[str, Any],
) -> None:
    spec = step(tasks["charge"])
    assert spec.name == "charge_card"
    assert spec.compensation is tasks["refund"]
    definition = Saga("order").step(tasks["charge"]).seal()
    assert definition.find_step("charge_card").compensation is tasks["refund"]  # type: ignore[union-attr]


def test_compensated_by_default_is_used_by_parallel_and_branch_members(
    tasks: dict[str, Any],
) -> None:
    definition = (
        Saga("order")
        .parallel("pay", step("card", tasks["charge"]))
        .branch("route", fast_or_slow, path("fast", step("again", tasks["charge"])))
        .seal()
    )
    assert definition.find_step("card").compensation is tasks["refund"]  # type: ignore[union-attr]
    assert definition.find_step("again").compensation is tasks["refund"]  # type: ignore[union-attr]


def test_explicit_compensate_overrides_the_compensated_by_default(tasks: dict[str, Any]) -> None:
    assert step(tasks["charge"], compensate=tasks["void"]).compensation is tasks["void"]
    definition = Saga("order").step("charge", tasks["charge"], compensate=tasks["void"]).seal()
    assert definition.find_step("charge").compensation is tasks["void"]  # type: ignore[union-attr]


def test_compensated_by_works_on_plain_functions_too() -> None:
    def pay(amount: int) -> int:
        return amount

    marked = compensated_by(refund)(pay)
    assert marked is pay
    assert step(pay).compensation is refund
    assert step("pay", pay, compensate=unship).compensation is unship


def test_task_decorated_with_compensated_by_still_works_as_a_normal_task(
    app: celery.Celery, tasks: dict[str, Any]
) -> None:
    charge_card = tasks["charge"]
    assert charge_card(5) == "charged 5 EUR"
    assert charge_card(7, currency="USD") == "charged 7 USD"
    assert charge_card.run(1) == "charged 1 EUR"
    assert charge_card.name == "t.payments.charge_card"
    assert app.tasks["t.payments.charge_card"] is charge_card._get_current_object()
    assert callable(charge_card.apply_async)


def test_step_from_a_non_callable_compensated_by_value_is_refused(tasks: dict[str, Any]) -> None:
    def pay(amount: int) -> int:
        return amount

    compensated_by("not a task")(pay)
    refused(lambda: Saga("order").step(pay), "order", "pay")
