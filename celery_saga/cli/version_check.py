"""``celery saga versions check``: run from the code about to ship, the runs it would
strand, with what ``saga upgrade`` can do for each; exit status 1 when there is one
(guarantee 22). ``--json`` for CI."""

from __future__ import annotations

from typing import Any

import click

from celery_saga.cli.commands import engine_of, operator_command
from celery_saga.cli.output import as_json, table
from celery_saga.cli.versions import versions
from celery_saga.decisions.versions import Stranding
from celery_saga.worker.version_check import StrandedRun


def _item(run: StrandedRun) -> dict[str, Any]:
    return {
        "execution_id": run.execution_id,
        "saga": run.saga,
        "version": run.version,
        "label": run.label,
        "state": run.state,
        "node": run.node,
        "upgrade": {
            "possible": run.stranding is Stranding.MOVABLE,
            "to": run.to,
            "node": run.differs,
            "reason": run.reason or None,
        },
    }


def _verdict(run: StrandedRun) -> str:
    if run.stranding is Stranding.MOVABLE:
        return f"can move to {run.to}: saga upgrade {run.execution_id} --to {run.to}"
    return f"cannot move: {run.reason}"


def _row(run: StrandedRun) -> list[str]:
    version = f"{run.version} ({run.label})" if run.label else run.version
    return [run.saga, run.execution_id, version, run.state, run.node or "-", _verdict(run)]


@versions.command()
@click.option("--json", "as_json_output", is_flag=True, help="Print JSON.")
@click.pass_context
@operator_command
def check(ctx: click.Context, as_json_output: bool) -> None:
    """The runs that are not over whose version this code does not register: deploying it
    alone would strand them. Exit status 1 when there is one; each says whether `saga
    upgrade` can move it to a version this code has."""
    found = engine_of(ctx).check_versions()
    stranded = found.stranded
    if as_json_output:
        click.echo(as_json({"ok": found.ok, "stranded": [_item(r) for r in stranded]}))
    elif stranded:
        headers = ["SAGA", "EXECUTION", "VERSION", "STATE", "AT NODE", "UPGRADE"]
        for line in table(headers, [_row(r) for r in stranded], widest=120):
            click.echo(line)
    else:
        click.echo("no run would be stranded: every run that is not over has its version here")
    if stranded:
        movable = sum(1 for r in stranded if r.stranding is Stranding.MOVABLE)
        raise click.ClickException(
            f"{len(stranded)} run(s) would be stranded by this code ({movable} can be moved "
            "with `saga upgrade`): upgrade or finish them before retiring their version"
        )
