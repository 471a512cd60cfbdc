"""The store work of the engine's public calls: retried through connection failures for
``saga_store_retry_budget`` s, then ``StoreUnavailableError`` (guarantee 26); a store that
refused its URL raises ``StoreConfigurationError`` at once."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import SQLAlchemyError

from celery_saga.errors import StoreUnavailableError
from celery_saga.runtime.ports import Settings
from celery_saga.store.database import Database
from celery_saga.store.transient import describe_store_error, is_transient, retry_transient
from celery_saga.store.url_errors import configuration_error, quieted

T = TypeVar("T")


class StoreCalls:
    """Runs a public call's store work on ``db``. ``settings`` is read at each call, so
    settings given to the engine later (``engine.settings = ...``) apply from its next call."""

    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.settings = settings

    def run(self, what: str, call: Callable[[], T]) -> T:
        """``call()``, retried through connection failures; ``what`` names it in the error
        raised past the budget."""
        budget = self.settings.store_retry_budget
        try:
            return retry_transient(call, budget=budget, what=what)
        except SQLAlchemyError as error:
            refused = configuration_error(error, self.db.url)
            if refused is not None:
                raise quieted(refused, error) from None
            if not is_transient(error):
                raise
            raise StoreUnavailableError(
                f"{what}: the saga store could not be reached within {budget:g} s "
                f"({describe_store_error(error)})"
            ) from error

    def ensure_schema(self) -> None:
        """Apply the store's migrations once per process (no-op when already current)."""
        self.run("migrating the saga store", self.db.migrate)
