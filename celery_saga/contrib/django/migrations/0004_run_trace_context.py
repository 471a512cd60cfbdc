"""The run's trace context (the store's migration 0014): the mirror model's field."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("celery_saga", "0003_every_store_column")]

    operations = [
        migrations.AddField(
            model_name="run",
            name="trace_context",
            field=models.CharField(max_length=64, null=True),
        ),
    ]
