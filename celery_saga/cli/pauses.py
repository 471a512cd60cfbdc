"""``celery saga pause | unpause | pauses``: pause a step (or a whole saga) for every run,
lift the pause and release the runs it held at a capped rate, and list what is paused."""

from __future__ import annotations

import click

from celery_saga.cli.commands import engine_of, operator_command, saga
from celery_saga.cli.follow import shell_operator
from celery_saga.durations import parse_rate
from celery_saga.records import Pause


def named(pause: Pause) -> str:
    """A pause as operators read it: ``saga.step``, or ``saga (every step)``."""
    return f"{pause.saga} (every step)" if pause.step is None else f"{pause.saga}.{pause.step}"


@saga.command()
@click.argument("saga_name", metavar="SAGA")
@click.option("--step", help="The step to pause (default: every step of the saga).")
@click.option("--reason", required=True, help="Why: shown by pauses, show and the web view.")
@click.option("--dry-run", is_flag=True, help="Check and say what it would do; store nothing.")
@click.pass_context
@operator_command
def pause(ctx: click.Context, saga_name: str, step: str | None, reason: str, dry_run: bool) -> None:
    """Pause a step (or a whole saga) for every run: a run that reaches it is held at its
    door, before its body starts, until unpause releases it."""
    engine, actor = engine_of(ctx), shell_operator()
    stored = engine.pause(saga_name, step, reason=reason, actor=actor, dry_run=dry_run)
    if dry_run:
        click.echo(f"dry run: would pause {named(stored)}; runs that reach it would be held")
        return
    click.echo(f"paused {named(stored)}: runs that reach it are held at its door")


@saga.command()
@click.argument("saga_name", metavar="SAGA")
@click.option("--step", help="The step to unpause (default: the pause of the whole saga).")
@click.option("--rate", help="Release the held runs at most this fast, e.g. 20/s or 600/m.")
@click.option("--reason", help="Why: recorded in each released run's history.")
@click.option("--dry-run", is_flag=True, help="Say what it would release; change nothing.")
@click.pass_context
@operator_command
def unpause(
    ctx: click.Context,
    saga_name: str,
    step: str | None,
    rate: str | None,
    reason: str | None,
    dry_run: bool,
) -> None:
    """Lift a pause and release the runs it held, earliest first; interrupted, run it
    again: it releases what is left, never a run twice."""
    per_second = None if rate is None else parse_rate(rate)
    engine = engine_of(ctx)
    if dry_run:
        seen = engine.unpause(saga_name, step, rate=per_second, dry_run=True)
        what = named(seen.pause) if seen.pause else "nothing (not paused)"
        click.echo(f"dry run: would unpause {what} and release {seen.released} held run(s)")
        return

    def progress(count: int) -> None:
        if count % 100 == 0:
            click.echo(f"released {count}", err=True)

    done = engine.unpause(
        saga_name,
        step,
        rate=per_second,
        actor=shell_operator(),
        reason=reason,
        progress=progress,
    )
    lifted = f"unpaused {named(done.pause)}" if done.pause else "nothing was paused"
    click.echo(f"{lifted}; released {done.released} held run(s)")


@saga.command()
@click.pass_context
@operator_command
def pauses(ctx: click.Context) -> None:
    """List the paused steps (and sagas): since when, by whom, why, how many runs held."""
    stored = engine_of(ctx).pauses()
    if not stored:
        click.echo("nothing is paused")
        return
    for each in stored:
        since = f"{each.paused_at:%Y-%m-%d %H:%M:%S} UTC"
        by = each.actor or "an operator"
        click.echo(f"{named(each)}  since {since} by {by}: {each.reason}  ({each.held} held)")
