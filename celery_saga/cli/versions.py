"""``celery saga versions`` and ``celery saga upgrade``: the versions of each saga side by
side, and moving one run to another version (guarantee 22). ``versions check`` is in
``version_check.py``."""

from __future__ import annotations

from dataclasses import asdict

import click

from celery_saga.cli.bulk import bulk_capable
from celery_saga.cli.commands import engine_of, operator_command, saga
from celery_saga.cli.follow import shell_operator
from celery_saga.cli.output import as_json, table
from celery_saga.definition.nodes import node_name
from celery_saga.worker.versioning import VersionInfo


def _row(version: VersionInfo) -> list[str]:
    here = "newest" if version.newest_here else ("yes" if version.registered_here else "-")
    seen = version.last_seen.strftime("%Y-%m-%d %H:%M:%S") if version.last_seen else "-"
    return [
        version.saga,
        version.hash,
        version.label or "-",
        here,
        str(version.live_runs),
        seen,
        ", ".join(version.seen_by) or "-",
    ]


@saga.group(invoke_without_command=True)
@click.option("--json", "as_json_output", is_flag=True, help="Print JSON.")
@click.pass_context
@operator_command
def versions(ctx: click.Context, as_json_output: bool) -> None:
    """Each saga's versions: where they were seen, how many live runs each still has. A
    version with 0 live runs can be deleted from the code; `versions check`, run from the
    code about to ship, says which runs it would strand."""
    if ctx.invoked_subcommand is not None:
        return
    found = engine_of(ctx).versions()
    if as_json_output:
        click.echo(as_json({"items": [asdict(v) for v in found]}))  # the fields, as named
        return
    if not found:
        click.echo("no sagas registered or stored")
        return
    headers = ["SAGA", "VERSION", "LABEL", "HERE", "LIVE RUNS", "LAST SEEN", "SEEN BY"]
    for line in table(headers, [_row(v) for v in found]):
        click.echo(line)


@saga.command()
@click.argument("execution_id", required=False)
@bulk_capable("upgrade")
@click.option("--to", "to", help="The version (hash or label); default: the newest one here.")
@click.option("--dry-run", is_flag=True, help="Check, print where it would go; change nothing.")
@click.pass_context
@operator_command
def upgrade(ctx: click.Context, execution_id: str, to: str | None, dry_run: bool) -> None:
    """Move a run to another version, when every node it has passed is unchanged there."""
    engine = engine_of(ctx)
    target = engine.upgrade(execution_id, to, actor=shell_operator(), dry_run=dry_run)
    label = f" ({target.label})" if target.label else ""
    if dry_run:
        cursor = engine.get(execution_id).record.cursor
        path = " -> ".join(node_name(node) for node in target.nodes[cursor:]) or "nothing"
        click.echo(f"plan: upgrade of {execution_id} to version {target.hash}{label}: allowed")
        click.echo(f"runs next, on that version: {path}")
        return
    click.echo(f"execution {execution_id} now runs version {target.hash}{label}")
