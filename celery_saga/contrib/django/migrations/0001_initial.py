"""The models over the saga tables (unmanaged: the store's own migrations make the tables);
Django keeps them in its migration state and makes their permissions."""

import celery_saga.contrib.django.models
from django.db import migrations, models


class Migration(migrations.Migration):  # type: ignore[misc]
    initial = True

    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="HistoryRow",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("at", celery_saga.contrib.django.models.StoredTime()),
                ("kind", models.CharField(max_length=40)),
                ("step", models.CharField(max_length=200, null=True)),
                ("attempt", models.IntegerField(null=True)),
                ("holder", models.CharField(max_length=200, null=True)),
                ("actor", models.CharField(max_length=200, null=True)),
                ("detail", models.TextField(null=True)),
                ("data", models.BinaryField(null=True)),
            ],
            options={
                "verbose_name": "saga history entry",
                "verbose_name_plural": "saga history",
                "db_table": "saga_history",
                "ordering": ("id",),
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
        migrations.CreateModel(
            name="Run",
            fields=[
                ("id", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("saga_name", models.CharField(max_length=200, verbose_name="saga")),
                ("definition_hash", models.CharField(max_length=64, verbose_name="version")),
                ("state", models.CharField(max_length=32)),
                ("cursor", models.IntegerField(verbose_name="node")),
                ("cursor_sub", models.IntegerField(verbose_name="position in node")),
                ("input", models.BinaryField()),
                ("failure_reason", models.TextField(null=True)),
                ("rollback_status", models.CharField(max_length=32, null=True)),
                ("rollback_reason", models.TextField(null=True)),
                ("committed_at", celery_saga.contrib.django.models.StoredTime(null=True)),
                (
                    "parent_execution_id",
                    models.CharField(max_length=64, null=True, verbose_name="parent run"),
                ),
                ("wake_at", celery_saga.contrib.django.models.StoredTime(null=True)),
                ("created_at", celery_saga.contrib.django.models.StoredTime()),
                ("updated_at", celery_saga.contrib.django.models.StoredTime()),
                ("cancelled_at", celery_saga.contrib.django.models.StoredTime(null=True)),
                ("deadline_at", celery_saga.contrib.django.models.StoredTime(null=True)),
            ],
            options={
                "verbose_name": "saga run",
                "db_table": "saga_executions",
                "ordering": ("-created_at", "-id"),
                "permissions": (
                    ("resume_run", "Can resume a parked unwind"),
                    ("abandon_run", "Can abandon a parked unwind"),
                    ("signal_run", "Can signal a run"),
                ),
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
        migrations.CreateModel(
            name="Step",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("name", models.CharField(max_length=200)),
                ("node", models.IntegerField()),
                ("sub", models.IntegerField(verbose_name="position in node")),
                ("status", models.CharField(max_length=16)),
                ("attempts", models.IntegerField()),
                ("result", models.BinaryField(null=True)),
                ("error", models.TextField(null=True)),
                ("started_at", celery_saga.contrib.django.models.StoredTime()),
                ("completed_at", celery_saga.contrib.django.models.StoredTime(null=True)),
                (
                    "compensation_status",
                    models.CharField(max_length=32, null=True, verbose_name="reversal"),
                ),
                ("compensation_reason", models.TextField(null=True, verbose_name="reversal error")),
                ("compensation_attempts", models.IntegerField(verbose_name="reversal attempts")),
                ("compensated_at", celery_saga.contrib.django.models.StoredTime(null=True)),
                (
                    "child_execution_id",
                    models.CharField(max_length=64, null=True, verbose_name="child run"),
                ),
                ("holder", models.CharField(max_length=200, null=True)),
            ],
            options={
                "verbose_name": "saga step",
                "db_table": "saga_steps",
                "ordering": ("node", "sub", "id"),
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
    ]
