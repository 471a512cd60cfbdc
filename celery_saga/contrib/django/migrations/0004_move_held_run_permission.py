"""The ``move_held_run`` permission, which the admin's retry, skip and unwind actions ask
for (issue 42)."""

from django.db import migrations

from celery_saga.contrib.django.migrations._shared import (
    CANCEL_RUN,
    MOVE_HELD_RUN,
    run_options,
)


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_saga", "0003_every_store_column")]

    operations = [run_options(CANCEL_RUN, MOVE_HELD_RUN)]
