"""``celery saga limits``: the busiest flow-control keys, with their live and queued runs
(guarantee 37)."""

from __future__ import annotations

from dataclasses import asdict

import click

from celery_saga.cli.commands import engine_of, operator_command, saga
from celery_saga.cli.output import as_json, table
from celery_saga.records import KeyLoad
from celery_saga.runtime.clock import get_clock


def _row(load: KeyLoad) -> list[str]:
    waited = "-"
    if load.oldest_queued is not None:
        waited = f"{(get_clock().now() - load.oldest_queued).total_seconds():.0f} s"
    key = load.key or "(saga total)"
    if load.kind == "step":  # a step's limit: the task it counts, its slots or a rate's
        live = f"{load.live}/{load.limit}" if load.limit else "rate"
        return [f"task {load.saga}", key, live, str(load.queued), waited]
    return [load.saga, key, f"{load.live}/{load.limit}", str(load.queued), waited]


@saga.command()
@click.option("--top", default=20, show_default=True, help="How many keys to list.")
@click.option("--json", "as_json_output", is_flag=True, help="Print JSON.")
@click.pass_context
@operator_command
def limits(ctx: click.Context, top: int, as_json_output: bool) -> None:
    """The busiest flow-control keys: runs queued, runs live of the limit, longest wait;
    then the busiest keys of limited steps: steps waiting at the door, slots granted."""
    if not 1 <= top <= 1000:
        raise click.BadParameter(f"--top takes 1 to 1000, got {top}")
    found = engine_of(ctx).inspect().limits(top)
    if as_json_output:
        click.echo(as_json({"items": [asdict(k) for k in found]}))
        return
    if not found:
        click.echo("no flow-control key has a live or queued run")
        return
    for line in table(["SAGA", "KEY", "LIVE", "QUEUED", "OLDEST WAIT"], [_row(k) for k in found]):
        click.echo(line)
