"""``python manage.py saga <command>``: the ``celery saga`` commands, unchanged, with the
project's Celery app. Arguments are handed to the same click group as they are typed."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
from django.core.management.base import BaseCommand, CommandError

from celery_saga.cli import saga
from celery_saga.contrib.django.app import project_celery_app
from celery_saga.errors import SagaError


def _context() -> SimpleNamespace:
    try:
        return SimpleNamespace(app=project_celery_app())
    except SagaError as error:
        raise CommandError(str(error)) from None


class Command(BaseCommand):  # type: ignore[misc]
    help = "Inspect and operate saga runs: list, show, plan, signal, resume, resolve, abandon ..."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("arguments", nargs=argparse.REMAINDER)

    def run_from_argv(self, argv: list[str]) -> None:
        # From a shell: click parses, prints and exits exactly as `celery saga` does.
        prog = f"{Path(argv[0]).name} {argv[1]}"
        try:
            obj = _context()
        except CommandError as error:
            raise click.ClickException(str(error)) from None
        saga.main(args=argv[2:], prog_name=prog, obj=obj)

    def handle(self, *args: Any, **options: Any) -> None:
        # From call_command(): refusals become CommandError, Django's way.
        arguments = list(options.get("arguments") or args)
        try:
            saga.main(args=arguments, prog_name="saga", obj=_context(), standalone_mode=False)
        except click.exceptions.Abort:
            raise CommandError("aborted") from None
        except click.ClickException as error:
            raise CommandError(error.format_message()) from None
