"""Claims given up by the worker whose pool process held them (guarantee 30).

A pool process that dies (SIGKILL, the OOM killer, ``os._exit``) cannot give its claims up;
its worker's main process, which learns of the death at once, does it for it, so the step
or reversal runs again within seconds instead of after its lease.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import update

from celery_saga.records import StepStatus
from celery_saga.store.database import Database, to_db_time
from celery_saga.store.tables import step_records


def release_claims_of(db: Database, *, execution_id: str, holder: str, now: datetime) -> int:
    """End the leases ``holder`` still has on steps and reversals of ``execution_id``
    (attempts stay counted); returns how many it had."""
    stamp = to_db_time(now)
    of_run = step_records.c.execution_id == execution_id
    with db.transaction() as connection:
        steps = connection.execute(
            update(step_records)
            .where(
                of_run,
                step_records.c.holder == holder,
                step_records.c.status == StepStatus.RUNNING.value,
                step_records.c.lease_expires_at > stamp,
            )
            .values(lease_expires_at=stamp)
        ).rowcount
        reversals = connection.execute(
            update(step_records)
            .where(
                of_run,
                step_records.c.compensation_holder == holder,
                step_records.c.compensation_status.is_(None),
                step_records.c.compensation_lease_expires_at > stamp,
            )
            .values(compensation_lease_expires_at=stamp)
        ).rowcount
    return int(steps or 0) + int(reversals or 0)
