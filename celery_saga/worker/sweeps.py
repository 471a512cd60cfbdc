"""The engine's sweeps, called by beat's tasks and by the public calls of the same name:
the recovery sweep, the timer sweep (with the cancels of overdue runs and the messages a
broker outage left owed), and retention (cleanup or archive)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.recovery import Recoverer
from celery_saga.store import retention
from celery_saga.worker.arguments import check_actor, check_age
from celery_saga.worker.beat import retention_interval
from celery_saga.worker.parts import WorkerParts


@dataclass(frozen=True)
class Sweeps:
    """One engine's sweeps (see the module's docstring), each one call of its store work."""

    parts: WorkerParts
    recoverer: Recoverer

    def recover(self, stale_after: float | None = None, actor: str | None = None) -> int:
        """``engine.recover``: republish the next message of every live run idle for
        ``stale_after`` seconds (default ``saga_recover_after``)."""
        check_actor(actor)
        parts = self.parts
        parts.store.ensure_schema()
        seconds = parts.settings.recover_after if stale_after is None else stale_after
        return parts.store.run(
            "the recovery sweep",
            lambda: self.recoverer.sweep(timedelta(seconds=seconds), actor=actor),
        )

    def fire_timers(self) -> int:
        """``engine.fire_timers``: how many runs were acted on."""
        executor = self.parts.executor
        self.parts.store.ensure_schema()
        return self.parts.store.run(
            "the timer sweep",
            lambda: (
                executor.fire_timers()
                + executor.cancel_overdue()
                + executor.unwind_expired_holds()
                + self.recoverer.send_owed()
            ),
        )

    def retire(
        self,
        older_than: float | timedelta,
        archive: bool,
        budget: float | None,
        actor: str | None = None,
    ) -> int:
        """``engine.cleanup`` or, with ``archive``, ``engine.archive``."""
        check_actor(actor)
        age = check_age(older_than, "archive(older_than)" if archive else "cleanup(older_than)")
        parts = self.parts
        parts.store.ensure_schema()
        now = get_clock().now()
        return parts.store.run(
            "archiving" if archive else "cleaning up",
            lambda: retention.retire(
                parts.db, cutoff=now - age, now=now, archive=archive, budget=budget, actor=actor
            ),
        )

    def retain(self, archive: bool) -> int:
        """Beat's cleanup (or, with ``archive``, archive) task: the runs older than
        ``saga_cleanup_after`` (``saga_archive_after``), for half the task's interval at
        most: a backlog is worked through over several runs of the task, none holding a
        worker for long, and two never overlap."""
        kind, app = ("archive" if archive else "cleanup"), self.parts.app
        budget = retention_interval(app, f"saga_{kind}_interval") / 2
        after = float(getattr(app.conf, f"saga_{kind}_after"))
        return self.retire(after, archive=archive, budget=budget)
