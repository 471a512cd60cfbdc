"""A run's flow-control key (the store's migration 0012). The models are unmanaged:
nothing runs against the database."""

from django.db import migrations

from celery_saga.contrib.django.migrations._shared import nullable_text


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_saga", "0005_paused_steps")]

    operations = [nullable_text("run", "flow_key", 200, "flow-control key")]
