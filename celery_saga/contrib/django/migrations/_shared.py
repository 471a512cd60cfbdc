"""What the mirror's migrations share: the run model's options, whose permissions
grow by one each time, and the nullable text column a later store migration adds. A released migration's effect never changes, so neither does
anything here (Django's loader skips this module: its name starts with an underscore)."""

from django.db import migrations, models

#: The run's permissions as the first migration made them.
FIRST_RUN_PERMISSIONS = (
    ("resume_run", "Can resume a parked unwind"),
    ("abandon_run", "Can abandon a parked unwind"),
    ("signal_run", "Can signal a run"),
)
CANCEL_RUN = ("cancel_run", "Can cancel a run")
MOVE_HELD_RUN = ("move_held_run", "Can retry, skip or unwind a held run")


def run_options(*added: tuple[str, str]) -> migrations.AlterModelOptions:
    """The run model's options, its permissions the first ones and then ``added``."""
    return migrations.AlterModelOptions(
        name="run",
        options={
            "verbose_name": "saga run",
            "ordering": ("-created_at", "-id"),
            "permissions": (*FIRST_RUN_PERMISSIONS, *added),
            "managed": False,
            "default_permissions": ("view",),
        },
    )


def nullable_text(
    model: str, name: str, max_length: int, verbose_name: str | None = None
) -> migrations.AddField:
    """A nullable text column ``name`` of ``max_length`` added to ``model``'s mirror."""
    field = models.CharField(max_length=max_length, null=True, verbose_name=verbose_name)
    return migrations.AddField(model_name=model, name=name, field=field)
