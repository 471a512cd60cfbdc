"""How commands print: JSON that never fails on stored values, plain aligned tables, and
one ``Error: ...`` line for every mistake in a command line."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click

from celery_saga.inspect import ReplicaLag
from celery_saga.inspect.jsonable import as_json

__all__ = ["OneLineErrors", "as_json", "say_staleness", "table", "usage_line"]

#: click 8.2+ raises this for a group given no command: its help, which stays as it is.
_HELP_SHOWN: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], widest: int = 60) -> list[str]:
    """Left-aligned columns, each as wide as its widest cell (cut at ``widest``)."""
    cells = [[c if len(c) <= widest else c[: widest - 1] + "…" for c in row] for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return lines


def usage_line(error: click.UsageError) -> str:
    """A usage error on one line: click's message, then where the help is."""
    message = " ".join(error.format_message().split())
    if isinstance(error, click.NoSuchOption) and error.option_name in ("-A", "--app"):
        message += " (the app option goes before the command: celery -A proj saga ...)"
    if error.ctx is not None:
        message += f" (see {error.ctx.command_path} --help)"
    return message


@contextmanager
def _one_line() -> Iterator[None]:
    try:
        yield
    except click.UsageError as error:
        if isinstance(error, _HELP_SHOWN):
            raise
        raise click.ClickException(usage_line(error)) from None


class OneLineErrors(click.Group):
    """A group whose usage errors (an unknown command or option, a missing or bad argument,
    in it or in any command under it) print one ``Error: ...`` line and exit with status 1,
    as its refusals do, instead of click's usage text and status 2."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        with _one_line():
            return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        with _one_line():
            return super().invoke(ctx)


def say_staleness(lag: ReplicaLag) -> None:
    """On stderr (JSON on stdout stays whole): that what follows was read from a replica
    that is behind the store, and by how much (``saga_read_store_url``); nothing when
    current."""
    if lag.worth_saying:
        click.echo(f"note: {lag.describe()}", err=True)
