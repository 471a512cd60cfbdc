"""The trace contexts of a run and of its steps' forward attempts (the store's migration
0014): the mirror models' fields."""

from django.db import migrations, models


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_saga", "0006_flow_key")]

    operations = [
        migrations.AddField(
            model_name="run",
            name="trace_context",
            field=models.CharField(max_length=64, null=True),
        ),
        migrations.AddField(
            model_name="step",
            name="trace_context",
            field=models.CharField(max_length=64, null=True),
        ),
    ]
