"""The ``move_held_run`` permission, which the admin's retry, skip and unwind actions ask
for (issue 42)."""

from django.db import migrations


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_saga", "0003_every_store_column")]

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
                    ("move_held_run", "Can retry, skip or unwind a held run"),
                ),
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
    ]
