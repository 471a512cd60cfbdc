"""Read-only models over the saga store's tables, for the Django admin (``admin.py``).

The tables belong to the store (its own migrations create them), so the models are
unmanaged. They read the database whose alias ``settings.SAGA_DATABASE`` names
(``"default"`` unless set): that alias must point at the saga store; with
``settings.SAGA_READ_DATABASE``, the alias of a read replica of it, they read that instead
(``staleness`` says how far behind it is). Payload columns are msgpack blobs;
``payloads.shown`` decodes them with the store's own codec.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from django.conf import settings
from django.db import models


def saga_database() -> str:
    """The alias of ``DATABASES`` that holds the saga tables."""
    return str(getattr(settings, "SAGA_DATABASE", "default"))


def saga_read_database() -> str:
    """The alias the admin reads the saga tables from: a replica's, else the store's."""
    return str(getattr(settings, "SAGA_READ_DATABASE", None) or saga_database())


class SagaManager(models.Manager):  # type: ignore[misc]
    """Every query of these models goes to the alias they read, router or not: they never
    write (the engine's calls change runs, on the store itself)."""

    def get_queryset(self) -> models.QuerySet[Any]:
        return super().get_queryset().using(saga_read_database())


class StoredTime(models.DateTimeField):  # type: ignore[misc]
    """The store keeps naive UTC timestamps: read back as aware UTC on every backend."""

    def from_db_value(self, value: datetime | None, *args: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value


class _Stored(models.Model):  # type: ignore[misc]
    """What every model here is: a row of the store's tables, unmanaged and read only
    through ``SagaManager``."""

    objects = SagaManager()

    class Meta:
        abstract = True
        managed = False
        # Nothing is added, changed or deleted here: the engine's calls do it (actions).
        default_permissions = ("view",)


class Run(_Stored):
    id = models.CharField(max_length=64, primary_key=True)
    saga_name = models.CharField("saga", max_length=200)
    definition_hash = models.CharField("version", max_length=64)
    state = models.CharField(max_length=32)
    cursor = models.IntegerField("node")
    cursor_sub = models.IntegerField("position in node")
    input = models.BinaryField()
    failure_reason = models.TextField(null=True)
    rollback_status = models.CharField(max_length=32, null=True)
    rollback_reason = models.TextField(null=True)
    committed_at = StoredTime(null=True)
    parent_execution_id = models.CharField("parent run", max_length=64, null=True)
    wake_at = StoredTime(null=True)
    created_at = StoredTime()
    updated_at = StoredTime()
    cancelled_at = StoredTime(null=True)
    deadline_at = StoredTime(null=True)
    flow_key = models.CharField("flow-control key", max_length=200, null=True)
    # The engine's bookkeeping, mapped so the model is the table (tests/test_django_models.py)
    # and not shown on the admin's pages.
    lease_expires_at = StoredTime(null=True)
    version = models.IntegerField()
    members_settled = models.IntegerField(null=True)
    members_failed = models.IntegerField(null=True)
    trace_context = models.CharField(max_length=64, null=True)

    class Meta(_Stored.Meta):
        db_table = "saga_executions"
        verbose_name = "saga run"
        ordering = ("-created_at", "-id")
        permissions = (
            ("resume_run", "Can resume a parked unwind"),
            ("abandon_run", "Can abandon a parked unwind"),
            ("signal_run", "Can signal a run"),
            ("cancel_run", "Can cancel a run"),
            ("move_held_run", "Can retry, skip or unwind a held run"),
        )

    def __str__(self) -> str:
        return f"{self.saga_name} {self.id}"


def _of_run(related_name: str) -> Any:
    """A row's run, by its ``execution_id`` column (the store's own schema declares the
    constraint; these unmanaged models never write)."""
    return models.ForeignKey(
        Run,
        on_delete=models.DO_NOTHING,
        db_column="execution_id",
        db_constraint=False,
        related_name=related_name,
    )


class Step(_Stored):
    id = models.BigIntegerField(primary_key=True)
    run = _of_run("steps")
    name = models.CharField(max_length=200)
    node = models.IntegerField()
    sub = models.IntegerField("position in node")
    status = models.CharField(max_length=16)
    attempts = models.IntegerField()
    result = models.BinaryField(null=True)
    error = models.TextField(null=True)
    started_at = StoredTime()
    completed_at = StoredTime(null=True)
    compensation_status = models.CharField("reversal", max_length=32, null=True)
    compensation_reason = models.TextField("reversal error", null=True)
    compensation_attempts = models.IntegerField("reversal attempts")
    compensated_at = StoredTime(null=True)
    child_execution_id = models.CharField("child run", max_length=64, null=True)
    holder = models.CharField(max_length=200, null=True)
    # The engine's bookkeeping, as on ``Run``.
    idempotency_key = models.CharField(max_length=400)
    compensatable = models.BooleanField()
    lease_expires_at = StoredTime(null=True)
    compensation_lease_expires_at = StoredTime(null=True)
    compensation_holder = models.CharField(max_length=200, null=True)
    trace_context = models.CharField(max_length=64, null=True)

    class Meta(_Stored.Meta):
        db_table = "saga_steps"
        verbose_name = "saga step"
        ordering = ("node", "sub", "id")

    def __str__(self) -> str:
        return f"{self.name} of {self.run_id}"


class HistoryRow(_Stored):
    id = models.BigIntegerField(primary_key=True)
    run = _of_run("history")
    at = StoredTime()
    kind = models.CharField(max_length=40)
    step = models.CharField(max_length=200, null=True)
    attempt = models.IntegerField(null=True)
    holder = models.CharField(max_length=200, null=True)
    actor = models.CharField(max_length=200, null=True)
    detail = models.TextField(null=True)
    data = models.BinaryField(null=True)
    #: A step attempt's start (its end is ``at``).
    started_at = StoredTime("attempt started", null=True)

    class Meta(_Stored.Meta):
        db_table = "saga_history"
        verbose_name = "saga history entry"
        verbose_name_plural = "saga history"
        ordering = ("id",)

    def __str__(self) -> str:
        return f"{self.kind} of {self.run_id}"


class PausedStep(_Stored):
    """A paused step (``step_name`` '': the whole saga). The store keys it by saga and
    step; Django (before 5.2) takes one key column, so the admin lists these rows and links
    to none (``PausedStepAdmin``)."""

    saga_name = models.CharField("saga", max_length=200, primary_key=True)
    step_name = models.CharField("step", max_length=200)
    reason = models.TextField()
    actor = models.CharField(max_length=200, null=True)
    paused_at = StoredTime()

    class Meta(_Stored.Meta):
        db_table = "saga_pauses"
        verbose_name = "paused step"
        ordering = ("saga_name", "step_name")

    def __str__(self) -> str:
        return f"{self.saga_name}.{self.step_name or '*'}"


class PausedRun(_Stored):
    """A run held at the door of a paused step, until an unpause releases it."""

    run = models.OneToOneField(
        Run,
        on_delete=models.DO_NOTHING,
        db_column="execution_id",
        db_constraint=False,
        primary_key=True,
        related_name="paused",
    )
    saga_name = models.CharField("saga", max_length=200)
    pause_step = models.CharField("held by the pause of", max_length=200)
    step_name = models.CharField("step", max_length=200)
    held_at = StoredTime()

    class Meta(_Stored.Meta):
        db_table = "saga_paused_runs"
        verbose_name = "run held at a paused step"
        ordering = ("held_at",)

    def __str__(self) -> str:
        return f"{self.run_id} at {self.step_name}"
