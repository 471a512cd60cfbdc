"""The ``cancel_run`` permission, which the admin's cancel action asks for."""

from django.db import migrations

from celery_saga.contrib.django.migrations._shared import CANCEL_RUN, run_options


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_saga", "0001_initial")]

    operations = [run_options(CANCEL_RUN)]
