"""The public error hierarchy: every error the library raises on purpose is a ``SagaError``."""

from __future__ import annotations


class SagaError(Exception):
    """Base class of every error raised by celery_saga on purpose."""


class DefinitionError(SagaError):
    """A saga definition is malformed (raised when it is built or registered)."""


class UnknownSagaError(SagaError):
    """A saga name was used that no registered definition carries."""


class ExecutionNotFoundError(SagaError):
    """An execution id names no stored execution."""


class InvalidStateError(SagaError):
    """An operator command was given to an execution in a state that does not allow it."""


class PayloadError(SagaError):
    """A value cannot be stored: unsupported type, or larger than the configured limit."""


class PayloadKeyError(SagaError):
    """A stored payload is sealed with a key this process does not hold (or that does not
    open it). Not the step's failure: a worker sends the message again later, an operator
    read says which key to configure. ``key_id`` names the key."""

    def __init__(self, key_id: str, message: str) -> None:
        super().__init__(message)
        self.key_id = key_id


class SchemaValidationError(SagaError):
    """A step's input or output was rejected by its schema."""


class StepTimeoutError(SagaError):
    """A step attempt or a reversal ran longer than its timeout."""


class DefinitionChangedError(SagaError):
    """A run's definition (its version) is not the one this process has."""


class VersionNotDeployedError(DefinitionChangedError):
    """The version a run started on is not registered in this process. A worker hands the
    run's message back for a worker that has it; an operator call says where to run it."""

    def __init__(self, message: str, saga_name: str, definition_hash: str) -> None:
        super().__init__(message)
        self.saga_name = saga_name
        self.definition_hash = definition_hash


class UpgradeRefusedError(SagaError):
    """``upgrade`` cannot move a run to the version asked for (a node it passed differs)."""


class BranchPathError(SagaError):
    """A branch selector returned a path name the branch does not define."""


class LoopError(SagaError):
    """A loop's condition did not return a bool, its items were not a list, or it wanted
    more iterations than ``max_iterations`` allows."""


class DuplicateSignalError(SagaError):
    """A signal for an event the execution has already received (first writer wins)."""


class UnknownEventError(SagaError):
    """A signal for an event no ``wait_for`` of the execution's saga waits for."""


class WaitTimeoutError(SagaError):
    """A ``wait_for`` gate's deadline passed without its signal (the run's failure reason)."""


class SubSagaError(SagaError):
    """A sub-saga could not be started: its input mapper raised or returned no mapping."""


class StoreUnavailableError(SagaError):
    """The saga store could not be reached within the retry budget
    (``saga_store_retry_budget``); nothing was changed by the call that raised it, unless
    the message says the outcome is unknown."""


class StoreConfigurationError(SagaError):
    """The store URL cannot work as given, and no retry would mend it: its driver is not
    installed, its SQLite file cannot be opened, or the database server answered and refused
    (no such database, a user it does not accept). The message names the cause and the fix;
    nothing was changed."""


class StepRetryRequested(SagaError):
    """A step's task asked for another attempt (``self.retry()``, or Celery's
    ``autoretry_for``). The saga retries it after ``countdown`` seconds while ``max_retries``
    allows (``None``: no limit); ``cause`` is the error that prompted it."""

    def __init__(self, cause: BaseException | None, countdown: float, max_retries: int | None):
        super().__init__(f"retry requested: {cause!r}" if cause else "retry requested")
        self.cause = cause
        self.countdown = countdown
        self.max_retries = max_retries


class RunNotSettledError(SagaError, TimeoutError):
    """``SagaHandle.wait()`` gave up before the run reached a state it waits for; the
    message says what the run is waiting for. Also a ``TimeoutError``, as it always was."""
