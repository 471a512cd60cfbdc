"""What ``start()`` refuses before anything is stored (guarantees 24 and 29)."""

from __future__ import annotations

from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.sub_sagas import Lookup, check_sub_sagas_known
from celery_saga.limits import check_new_execution_id


def refuse_before_start(lookup: Lookup, definition: SagaDefinition, execution_id: object) -> None:
    """A caller-chosen id no column can store, or a sub-saga (at any depth) not registered
    in this process, raises a ``SagaError`` before the run is created."""
    check_new_execution_id(execution_id)
    check_sub_sagas_known(lookup, definition)
