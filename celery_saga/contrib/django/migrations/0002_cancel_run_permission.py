"""The ``cancel_run`` permission, which the admin's cancel action asks for."""

from django.db import migrations


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_saga", "0001_initial")]

    operations = [
        migrations.AlterModelOptions(
            name="run",
            options={
                "verbose_name": "saga run",
                "ordering": ("-created_at", "-id"),
                "permissions": (
                    ("resume_run", "Can resume a parked unwind"),
                    ("abandon_run", "Can abandon a parked unwind"),
                    ("signal_run", "Can signal a run"),
                    ("cancel_run", "Can cancel a run"),
                ),
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
    ]
