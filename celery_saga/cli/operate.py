"""``celery saga signal | resume | resolve | abandon | cancel | plan``: the operator's verbs
on one run.

Each refuses an archived run (read-only) with one ``Error: ...`` line before it acts, and
leaves the verdict to the engine's public API, which the web view and Flower use too. Each
move takes ``--dry-run``: it prints the move's plan (``plan --move``) and changes nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from celery_saga.cli.bulk import bulk_capable
from celery_saga.cli.commands import engine_of, live_run, operator_command, saga
from celery_saga.cli.follow import shell_operator
from celery_saga.decisions.cancel import CancelVerdict
from celery_saga.decisions.plan import PLANNERS
from celery_saga.errors import InvalidStateError, SagaError
from celery_saga.inspect.plan_text import plan_json, plan_lines
from celery_saga.records import ExecutionRecord, ExecutionState
from celery_saga.typed_payload import parse_payload
from celery_saga.worker.engine import SagaEngine
from celery_saga.worker.run_commands import NO_OP


def live_record(engine: SagaEngine, execution_id: str) -> ExecutionRecord:
    """The run an operator's verb acts on, read fresh; refused when archived."""
    run = live_run(engine, execution_id, fresh=True)  # not a replica's older copy
    if run.archived_at is not None:
        raise InvalidStateError(
            f"execution {execution_id!r} is archived; archived runs are read-only"
        )
    return run.record


def _payload(payload: str | None, payload_file: str | None) -> Any:
    if payload is not None and payload_file is not None:
        raise click.UsageError("give --payload or --payload-file, not both")
    if payload_file is not None:
        try:
            payload = sys.stdin.read() if payload_file == "-" else Path(payload_file).read_text()
        except OSError as error:
            raise SagaError(
                f"cannot read --payload-file {payload_file!r}: {error.strerror}"
            ) from None
    return None if payload is None else parse_payload(payload)


#: ``--dry-run``: print the plan, change nothing.
dry_run_option = click.option(
    "--dry-run", is_flag=True, help="Print what the move would do (its plan); change nothing."
)


def print_plan(
    engine: SagaEngine, execution_id: str, move: str, step: str | None = None, json: bool = False
) -> None:
    """The plan of ``move`` on the run, as text or JSON."""
    found = engine.plan(execution_id, move, step=step)
    click.echo(plan_json(found) if json else "\n".join(plan_lines(found)))


@saga.command()
@click.argument("execution_id")
@click.option("--move", type=click.Choice(list(PLANNERS)), default="unwind", show_default=True)
@click.option("--step", help="The step the move names (resolve: default the parked one).")
@click.option("--json", "as_json_output", is_flag=True, help="Print JSON.")
@click.pass_context
@operator_command
def plan(
    ctx: click.Context, execution_id: str, move: str, step: str | None, as_json_output: bool
) -> None:
    """What a move would do to a run, changing nothing: which reversals run, in which
    order, with which inputs; which steps are past the pivot."""
    print_plan(engine_of(ctx), execution_id, move, step, as_json_output)


@saga.command()
@click.argument("execution_id")
@click.argument("event")
@click.option("--payload", help="The signal's payload as JSON.")
@click.option("--payload-file", help="Read the JSON payload from a file ('-': stdin).")
@click.pass_context
@operator_command
def signal(
    ctx: click.Context,
    execution_id: str,
    event: str,
    payload: str | None,
    payload_file: str | None,
) -> None:
    """Deliver EVENT to a run waiting for it (or about to)."""
    value = _payload(payload, payload_file)
    engine = engine_of(ctx)
    live_record(engine, execution_id)
    resumed = engine.signal(execution_id, event, value, actor=shell_operator())
    click.echo(
        f"signal {event!r} recorded for {execution_id}; "
        + ("the run resumed" if resumed else "the run will take it when it reaches the gate")
    )


@saga.command()
@click.argument("execution_id", required=False)
@bulk_capable("resume")
@dry_run_option
@click.pass_context
@operator_command
def resume(ctx: click.Context, execution_id: str, dry_run: bool) -> None:
    """Retry the failed reversal of a compensation_stuck run and continue its unwind."""
    engine = engine_of(ctx)
    live_record(engine, execution_id)
    if dry_run:
        print_plan(engine, execution_id, "resume")
        return
    engine.resume_compensation(execution_id, actor=shell_operator())
    click.echo(f"resumed the unwind of {execution_id}; the workers carry it on")


@saga.command()
@click.argument("execution_id", required=False)
@bulk_capable("resolve")
@click.option("--step", required=True, help="The step whose failed reversal was done by hand.")
@click.option("--note", required=True, help="What was done by hand: kept in the run's history.")
@dry_run_option
@click.pass_context
@operator_command
def resolve(ctx: click.Context, execution_id: str, step: str, note: str, dry_run: bool) -> None:
    """Record the failed reversal of STEP in a compensation_stuck run as done by hand, and
    continue its unwind with the next step."""
    engine = engine_of(ctx)
    live_record(engine, execution_id)
    if dry_run:
        print_plan(engine, execution_id, "resolve", step)
        return
    engine.resolve(execution_id, step=step, note=note, actor=shell_operator())
    click.echo(
        f"resolved the reversal of {step} in {execution_id} (done by hand); "
        "the workers carry the unwind on"
    )


@saga.command()
@click.argument("execution_id", required=False)
@bulk_capable("abandon")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--reason", help="Why: recorded in the run's history and shown by show.")
@dry_run_option
@click.pass_context
@operator_command
def abandon(
    ctx: click.Context, execution_id: str, yes: bool, reason: str | None, dry_run: bool
) -> None:
    """Give up a parked unwind: the run ends failed, outstanding reversals skipped."""
    engine = engine_of(ctx)
    record = live_record(engine, execution_id)
    if dry_run:
        print_plan(engine, execution_id, "abandon")
        return
    if record.state is not ExecutionState.COMPENSATION_STUCK:
        raise InvalidStateError(
            f"abandon needs execution {execution_id!r} (saga {record.saga_name!r}) to be "
            f"compensation_stuck; it is {record.state.value}"
        )
    if not yes:
        click.confirm(
            f"The steps of {execution_id} (saga {record.saga_name}) not yet reversed will "
            "never be reversed, and the run ends failed. Abandon its unwind?",
            abort=True,
        )
    skipped = engine.abandon_compensation(execution_id, actor=shell_operator(), reason=reason)
    click.echo(f"abandoned {execution_id}: {skipped} step(s) marked compensation_skipped")


@saga.command()
@click.argument("execution_id", required=False)
@bulk_capable("cancel")
@click.option("--reason", help="Why: recorded as the run's failure reason and shown by show.")
@dry_run_option
@click.pass_context
@operator_command
def cancel(ctx: click.Context, execution_id: str, reason: str | None, dry_run: bool) -> None:
    """Cancel a run: nothing new starts, its running body is stopped, what it did is
    unwound, and it ends cancelled. Refused past the pivot and once ended."""
    if dry_run:
        print_plan(engine_of(ctx), execution_id, "cancel")
        return
    verdict = engine_of(ctx).cancel(execution_id, reason, actor=shell_operator())
    if verdict is CancelVerdict.CANCEL:
        click.echo(f"cancelled {execution_id}; what it did is unwound by the workers")
    else:
        click.echo(f"execution {execution_id} {NO_OP[verdict]}")
