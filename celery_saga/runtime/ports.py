"""What the runtime needs from the outside: publishing messages, emitting events, settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from celery_saga.decisions.admission import NodeMessage
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import StepSpec
from celery_saga.store.codec import DEFAULT_MAX_PAYLOAD_BYTES
from celery_saga.store.database import Database


class Publisher(Protocol):
    def publish_node(
        self,
        saga_name: str,
        spec: StepSpec | None,
        message: NodeMessage,
        countdown: float | None = None,
        label: str | None = None,
    ) -> None:
        """Send the node task for ``message``, routed and named after ``spec``'s action
        (a control node without a step is named ``label``)."""

    def publish_compensation(
        self,
        saga_name: str,
        spec: StepSpec | None,
        execution_id: str,
        step_name: str,
        attempt: int,
        countdown: float | None = None,
    ) -> None:
        """Send the compensate task for one reversal."""


class EventSink(Protocol):
    def __call__(self, event: str, fields: dict[str, Any]) -> None:
        """Deliver one saga event (``saga-step-completed`` ...) with its fields."""


@dataclass(frozen=True)
class Settings:
    """Engine-wide knobs (read from the Celery app's ``saga_*`` settings).

    ``lease_seconds``: how long a claimed step is protected from a duplicate message when it
    declares no timeout; ``compensation_timeout``: the default reversal timeout
    (guarantee 7); ``max_payload_bytes``: largest encoded input or result;
    ``store_retry_delays``: pauses between retries of a failure record that the store refused;
    ``lease_margin``: added to a step's or reversal's timeout to form its lease;
    ``recover_after``: how long a live run may go without progress before the recovery sweep
    republishes its next message (keep it above every step's ``backoff_max``).
    """

    lease_seconds: float = 300.0
    compensation_timeout: float = 30.0
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    store_retry_delays: tuple[float, ...] = (0.05, 0.2, 0.5, 1.0, 2.0)
    lease_margin: float = 30.0
    recover_after: float = 60.0


class Catalog:
    """The deployed definitions by name; calling it looks one up."""

    def __init__(self) -> None:
        self._definitions: dict[str, SagaDefinition] = {}
        self._children: frozenset[str] = frozenset()

    def __call__(self, name: str) -> SagaDefinition | None:
        return self._definitions.get(name)

    def names(self) -> list[str]:
        return sorted(self._definitions)

    def add(self, definition: SagaDefinition) -> None:
        self._definitions[definition.name] = definition
        self._children = frozenset(
            child for known in self._definitions.values() for child in known.child_sagas
        )

    def may_be_child(self, name: str) -> bool:
        """Whether some deployed saga runs ``name`` as a sub-saga (so a run of it may have a
        parent to notify)."""
        return name in self._children


class RuntimeParts:
    """What the forward executor and the unwinder share: the store, the deployed
    definitions, the way out to the broker, the event sink and the settings."""

    def __init__(
        self,
        db: Database,
        registry: Catalog,
        publisher: Publisher,
        emit: EventSink,
        settings: Settings,
    ) -> None:
        self.db, self.registry, self.publisher = db, registry, publisher
        self.emit, self.settings = emit, settings
