"""Every column of the store's tables in the models: a step's and a history row's run (in
the models since the start, never recorded here), the attempt's start on a history row (in
the model since the store's migration 0009, never recorded either) and the engine's
bookkeeping columns. The models are unmanaged: nothing runs against the database."""

import django.db.models.deletion
import celery_saga.contrib.django.models
from django.db import migrations, models


def _time() -> celery_saga.contrib.django.models.StoredTime:
    return celery_saga.contrib.django.models.StoredTime(null=True)


def _of_run(related_name: str) -> models.ForeignKey:
    return models.ForeignKey(
        db_column="execution_id",
        db_constraint=False,
        on_delete=django.db.models.deletion.DO_NOTHING,
        related_name=related_name,
        to="celery_saga.run",
    )


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_saga", "0002_cancel_run_permission")]

    operations = [
        migrations.AddField(
            model_name="step", name="run", field=_of_run("steps"), preserve_default=False
        ),
        migrations.AddField(
            model_name="historyrow", name="run", field=_of_run("history"), preserve_default=False
        ),
        migrations.AddField(
            model_name="historyrow",
            name="started_at",
            field=celery_saga.contrib.django.models.StoredTime(
                null=True, verbose_name="attempt started"
            ),
        ),
        migrations.AddField(model_name="run", name="lease_expires_at", field=_time()),
        migrations.AddField(
            model_name="run",
            name="version",
            field=models.IntegerField(default=1),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="run", name="members_settled", field=models.IntegerField(null=True)
        ),
        migrations.AddField(
            model_name="run", name="members_failed", field=models.IntegerField(null=True)
        ),
        migrations.AddField(
            model_name="step",
            name="idempotency_key",
            field=models.CharField(default="", max_length=400),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="step",
            name="compensatable",
            field=models.BooleanField(default=True),
            preserve_default=False,
        ),
        migrations.AddField(model_name="step", name="lease_expires_at", field=_time()),
        migrations.AddField(model_name="step", name="compensation_lease_expires_at", field=_time()),
        migrations.AddField(
            model_name="step",
            name="compensation_holder",
            field=models.CharField(max_length=200, null=True),
        ),
    ]
