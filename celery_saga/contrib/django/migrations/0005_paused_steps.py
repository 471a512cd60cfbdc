"""The paused steps and the runs held at their doors (the store's migration 0015). The
models are unmanaged: nothing runs against the database."""

import celery_saga.contrib.django.models
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_saga", "0004_move_held_run_permission")]

    operations = [
        migrations.CreateModel(
            name="PausedStep",
            fields=[
                (
                    "saga_name",
                    models.CharField(
                        max_length=200, primary_key=True, serialize=False, verbose_name="saga"
                    ),
                ),
                ("step_name", models.CharField(max_length=200, verbose_name="step")),
                ("reason", models.TextField()),
                ("actor", models.CharField(max_length=200, null=True)),
                ("paused_at", celery_saga.contrib.django.models.StoredTime()),
            ],
            options={
                "verbose_name": "paused step",
                "db_table": "saga_pauses",
                "ordering": ("saga_name", "step_name"),
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
        migrations.CreateModel(
            name="PausedRun",
            fields=[
                (
                    "run",
                    models.OneToOneField(
                        db_column="execution_id",
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        primary_key=True,
                        related_name="paused",
                        serialize=False,
                        to="celery_saga.run",
                    ),
                ),
                ("saga_name", models.CharField(max_length=200, verbose_name="saga")),
                (
                    "pause_step",
                    models.CharField(max_length=200, verbose_name="held by the pause of"),
                ),
                ("step_name", models.CharField(max_length=200, verbose_name="step")),
                ("held_at", celery_saga.contrib.django.models.StoredTime()),
            ],
            options={
                "verbose_name": "run held at a paused step",
                "db_table": "saga_paused_runs",
                "ordering": ("held_at",),
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
    ]
