"""The trace contexts of a run and of its steps' forward attempts (the store's migration
0014): the mirror models' fields."""

from django.db import migrations

from celery_saga.contrib.django.migrations._shared import nullable_text


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_saga", "0006_flow_key")]

    operations = [
        nullable_text("run", "trace_context", 64),
        nullable_text("step", "trace_context", 64),
    ]
