"""A run's flow-control key (the store's migration 0012). The models are unmanaged:
nothing runs against the database."""

from django.db import migrations, models


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_saga", "0005_paused_steps")]

    operations = [
        migrations.AddField(
            model_name="run",
            name="flow_key",
            field=models.CharField(max_length=200, null=True, verbose_name="flow-control key"),
        ),
    ]
