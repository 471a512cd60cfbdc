"""``celery saga retry | skip | unwind``: the operator's moves on a held run (a step with
``on_failure="hold"`` that failed for good). Each leaves the verdict to the engine's public
API (``worker/held_moves.py``), which the web view and the Django admin use too: a run
that is not held is refused naming its state, and nothing is stored."""

from __future__ import annotations

import click

from celery_saga.cli.bulk import bulk_capable
from celery_saga.cli.commands import engine_of, operator_command, saga
from celery_saga.cli.follow import shell_operator
from celery_saga.cli.operate import dry_run_option, live_record, print_plan
from celery_saga.typed_payload import parse_payload

_REASON = "Why: recorded in the run's history with who acted."


@saga.command()
@click.argument("execution_id", required=False)
@bulk_capable("retry")
@click.option("--reason", help=_REASON)
@dry_run_option
@click.pass_context
@operator_command
def retry(ctx: click.Context, execution_id: str, reason: str | None, dry_run: bool) -> None:
    """Run the held step of a held run again (a fresh set of attempts, the same
    idempotency key); the run then goes on."""
    engine = engine_of(ctx)
    live_record(engine, execution_id)
    if dry_run:
        print_plan(engine, execution_id, "retry")
        return
    engine.retry(execution_id, actor=shell_operator(), reason=reason)
    click.echo(f"retrying the held step of {execution_id}; the workers carry the run on")


@saga.command()
@click.argument("execution_id", required=False)
@bulk_capable("skip")
@click.option("--result", help="The step's result as JSON (checked against its output_schema).")
@click.option("--reason", help=_REASON)
@dry_run_option
@click.pass_context
@operator_command
def skip(
    ctx: click.Context, execution_id: str, result: str | None, reason: str | None, dry_run: bool
) -> None:
    """Record the held step of a held run completed by hand with --result; the run goes
    on (a later unwind still reverses the step)."""
    value = None if result is None else parse_payload(result)
    engine = engine_of(ctx)
    live_record(engine, execution_id)
    if dry_run:
        print_plan(engine, execution_id, "skip")
        return
    engine.skip(execution_id, result=value, actor=shell_operator(), reason=reason)
    click.echo(f"skipped the held step of {execution_id}; the workers carry the run on")


@saga.command()
@click.argument("execution_id", required=False)
@bulk_capable("unwind")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--reason", help=_REASON)
@dry_run_option
@click.pass_context
@operator_command
def unwind(
    ctx: click.Context, execution_id: str, yes: bool, reason: str | None, dry_run: bool
) -> None:
    """Begin the unwind of a held run now, as its step's failure would have. Refused past
    the pivot."""
    engine = engine_of(ctx)
    record = live_record(engine, execution_id)
    if dry_run:
        print_plan(engine, execution_id, "unwind")
        return
    if not yes:
        click.confirm(
            f"What {execution_id} (saga {record.saga_name}) did is reversed and the run ends "
            "failed. Unwind it?",
            abort=True,
        )
    engine.unwind(execution_id, actor=shell_operator(), reason=reason)
    click.echo(f"unwinding {execution_id}; the workers reverse what it did")
