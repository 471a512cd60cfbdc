"""Saga semantics for Celery: durable multi-step workflows with reverse-order compensation."""

from importlib.metadata import PackageNotFoundError, version

from celery_saga.decisions.cancel import CancelVerdict
from celery_saga.definition.builder import Saga, SagaDefinition, compensated_by, path, step
from celery_saga.definition.flow import Limit, Rate
from celery_saga.errors import (
    BranchPathError,
    DefinitionChangedError,
    DefinitionError,
    DuplicateSignalError,
    ExecutionNotFoundError,
    InvalidStateError,
    LoopError,
    PayloadError,
    PayloadKeyError,
    RunNotSettledError,
    SagaError,
    SchemaValidationError,
    StepTimeoutError,
    StoreConfigurationError,
    StoreUnavailableError,
    SubSagaError,
    UnknownEventError,
    UnknownSagaError,
    UpgradeRefusedError,
    VersionNotDeployedError,
    WaitTimeoutError,
)
from celery_saga.records import (
    CompensationOutcome,
    Execution,
    ExecutionRecord,
    ExecutionState,
    Pause,
    RollbackStatus,
    StepRecord,
    StepStatus,
)
from celery_saga.runtime.clock import Clock, SystemClock, get_clock, set_clock
from celery_saga.runtime.holders import cancelled, fencing_token
from celery_saga.runtime.saga_context import SagaContext
from celery_saga.store.queries import Page
from celery_saga.worker.engine import SagaEngine
from celery_saga.worker.handle import SagaHandle

try:
    __version__ = version("celery-saga-engine")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "BranchPathError",
    "CancelVerdict",
    "Clock",
    "CompensationOutcome",
    "DefinitionChangedError",
    "DefinitionError",
    "DuplicateSignalError",
    "Execution",
    "ExecutionNotFoundError",
    "ExecutionRecord",
    "ExecutionState",
    "InvalidStateError",
    "Limit",
    "LoopError",
    "Page",
    "Pause",
    "PayloadError",
    "PayloadKeyError",
    "Rate",
    "RollbackStatus",
    "RunNotSettledError",
    "Saga",
    "SagaContext",
    "SagaDefinition",
    "SagaEngine",
    "SagaError",
    "SagaHandle",
    "SchemaValidationError",
    "StepRecord",
    "StepStatus",
    "StepTimeoutError",
    "StoreConfigurationError",
    "StoreUnavailableError",
    "SubSagaError",
    "SystemClock",
    "UnknownEventError",
    "UnknownSagaError",
    "UpgradeRefusedError",
    "VersionNotDeployedError",
    "WaitTimeoutError",
    "__version__",
    "cancelled",
    "compensated_by",
    "fencing_token",
    "get_clock",
    "path",
    "set_clock",
    "step",
]
