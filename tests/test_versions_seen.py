"""``celery saga versions`` says when each worker was last seen running with a version, not
only when it started: a running worker records its versions again every ``SEEN_EVERY``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from celery_saga import Saga, SagaEngine
from celery_saga.store.versions import list_seen
from celery_saga.worker import versioning
from tests.conftest import unconsumed_app


def test_a_running_worker_keeps_its_versions_last_seen_fresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(versioning, "SEEN_EVERY", 0.05)
    engine = SagaEngine(unconsumed_app("seen"), store_url=f"sqlite:///{tmp_path}/seen.sqlite3")
    engine.register(Saga("order").step("a", lambda: None))
    engine.versioning.announce()
    (first,) = list_seen(engine.db)
    deadline = time.monotonic() + 10
    while (seen := list_seen(engine.db)[0]).last_seen == first.last_seen:
        assert time.monotonic() < deadline, "last_seen was never refreshed"
        time.sleep(0.05)
    assert seen.first_seen == first.first_seen < seen.last_seen
    assert len(list_seen(engine.db)) == 1, "one row per (saga, version, worker), updated"
