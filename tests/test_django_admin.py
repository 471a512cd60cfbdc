"""The Django admin shows runs, their steps and history, and its operator actions go
through the engine, behind their permissions, recorded with the Django user: driven by
Django's test client in the minimal project of tests/djangosite (its own process), on
SQLite, and on PostgreSQL kept apart from Django's own database (``SAGA_DATABASE``)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import PORTS, _test_database_url, require_services
from tests.django_probe import run_probe


def _probe(store: str, django_db: str | None) -> dict[str, Any]:
    extra = {} if django_db is None else {"SHOP_DJANGO_DB": django_db}
    return run_probe("admin_probe.py", store, "admin", **extra)


@pytest.fixture(scope="module", params=["sqlite", "postgresql-beside-django"])
def seen(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    tmp_path = tmp_path_factory.mktemp(request.param)
    if request.param == "sqlite":
        return _probe(f"sqlite:///{tmp_path / 'shop.sqlite3'}", None)
    require_services(PORTS["postgres"])
    return _probe(_test_database_url(), str(tmp_path / "django.sqlite3"))


def test_the_admin_lists_filters_and_finds_runs(seen: dict[str, Any]) -> None:
    assert seen["states"] == ["completed", "compensation_stuck", "compensation_stuck", "waiting"]
    assert seen["list"] == [200, True]
    assert seen["list_parked"] == [200, True, False]  # the state filter
    assert seen["search"] == [200, True, False]  # a whole id finds its run alone


def test_a_run_page_shows_its_decoded_input_its_steps_in_order_and_its_history(
    seen: dict[str, Any],
) -> None:
    assert seen["detail"] == [200, True, True]
    reserve, charge = seen["detail_steps"]
    assert 0 < reserve < charge


def test_a_run_page_draws_the_read_apis_graph_in_its_words(seen: dict[str, Any]) -> None:
    """The graph on the run's page is the one ``saga show`` and the web view draw."""
    assert seen["detail_graph"] == seen["read_graph"]
    assert ["reserve", "completed -> compensation_failed"] in seen["detail_graph"]
    assert seen["detail_history"] == [200, True, True]
    assert seen["step_list"] == [200, True, False]
    assert seen["history_list"] == [200, True]


def test_a_run_page_shows_what_its_saga_marks_sensitive_as_redacted(seen: dict[str, Any]) -> None:
    assert seen["detail_redacted"] == [200, True, True, True]


def test_no_lookup_in_the_url_reads_a_payload_column_for_any_user(seen: dict[str, Any]) -> None:
    """The hex (PostgreSQL) or regex (SQLite) guesses that read a redacted card back one
    character at a time find nothing: the lists take their filters' parameters only."""
    assert seen["extracted"] == ["", ""]
    refused = {url: statuses for url, statuses in seen["crafted"].items() if statuses != [400, 400]}
    assert refused == {}
    assert set(seen["filters"].values()) == {200}


def test_a_payload_that_cannot_be_decoded_is_said_so_on_a_page_that_still_shows(
    seen: dict[str, Any],
) -> None:
    assert seen["corrupt"] == [200, True]


def test_resume_from_the_admin_continues_the_unwind_and_records_the_user(
    seen: dict[str, Any],
) -> None:
    assert seen["root_actions"] == [True]
    status, state, rollback, rows = seen["resume"]
    assert (status, state, rollback) == (200, "failed", "completed")
    assert [row[:2] for row in rows] == [["resumed", "root"]]


def test_a_user_without_the_permission_is_not_offered_the_action_and_changes_nothing(
    seen: dict[str, Any],
) -> None:
    assert seen["viewer_list"] == [200, True, False]
    assert seen["viewer_resume"] == [200, "compensation_stuck", []]


def test_abandon_asks_first_then_ends_the_run_and_records_the_user(seen: dict[str, Any]) -> None:
    """Posted with CSRF checks on: the confirmation's form carries its token."""
    assert seen["abandon_asks"] == [200, True, "compensation_stuck"]
    status, state, rollback, rows = seen["abandon"]
    assert (status, state, rollback) == (200, "failed", "stuck")
    assert [row[:2] for row in rows] == [["abandoned", "root"]]


def test_resolve_shows_its_plan_first_then_goes_on_and_shows_done_by_hand_with_note_and_user(
    seen: dict[str, Any],
) -> None:
    status, plan, state = seen["resolve_asks"]
    assert (status, state) == (200, "compensation_stuck")
    assert plan[0].startswith("plan: resolve of ") and plan[1] == (
        "step: reserve (its reversal recorded as done by hand)"
    )
    status, state, rollback, rows = seen["resolve"]
    assert (status, state, rollback) == (200, "failed", "completed")
    assert rows == [["resolved", "root", "released in the shop UI"]]
    assert seen["resolve_detail"] == [True, True]


def test_signal_takes_an_event_and_a_json_payload_and_records_the_user(
    seen: dict[str, Any],
) -> None:
    assert seen["signal_bad_json"] == [200, True, "waiting"]
    status, state, rows = seen["signal"]
    assert (status, state) == (200, "completed")
    assert [row[:2] for row in rows] == [["signalled", "root"]]


def test_cancel_needs_its_own_permission_asks_first_and_records_the_user_and_reason(
    seen: dict[str, Any],
) -> None:
    """A staff user with the view permissions, or with resume, abandon and signal, is not
    offered the cancel and a post of it changes nothing; one with ``cancel_run`` is."""
    assert seen["cancel_offered"] == [False, False, True]
    assert seen["cancel_refused"] == [[200, 200], "waiting", []]
    assert seen["cancel_asks"] == [200, True, "waiting"]
    status, state, rows = seen["cancel"]
    assert (status, state) == (200, "cancelled")
    assert [row[:2] for row in rows] == [["cancelled", "canceller"]]
    assert "customer withdrew" in str(rows[0][2])
    assert seen["cancel_again"] == [200, True, 1]


def test_an_action_the_engine_refuses_shows_why_and_records_nothing(seen: dict[str, Any]) -> None:
    assert seen["resume_refused"] == [200, True, True, []]


def test_check_names_a_saga_database_that_is_not_configured(seen: dict[str, Any]) -> None:
    assert "celery_saga.E001" in seen["check"]
    assert "celery_saga.E001" not in seen["check_now"]


def test_the_admin_lists_the_paused_steps_and_the_runs_held_at_their_doors(
    seen: dict[str, Any],
) -> None:
    assert seen["paused_steps"] == [200, True, True]
    assert seen["paused_runs"] == [200, True, "held"]


def test_labels_are_shown_searched_and_a_bulk_cancel_acts_on_what_the_search_selects(
    seen: dict[str, Any],
) -> None:
    assert seen["label_search"] == [200, [True, True, False]]
    assert seen["label_shown"] == [200, True]
    assert seen["bulk_asks"] == [200, True]
    assert seen["bulk_asks_states"] == ["waiting"] * 3
    status, said, actors = seen["bulk_cancel"]
    assert (status, said) == (200, True)
    assert len(actors[0]) == len(actors[1]) == 1 and actors[2] == []
    assert actors[0][0] == actors[1][0] and actors[0][0].startswith("root (bulk bulk-")
    assert seen["bulk_unfiltered"] == [200, True]
    assert seen["bulk_moves_offered"] == [True, True, True]
