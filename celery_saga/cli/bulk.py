"""``--where`` on the operator's moves: ``celery saga cancel --where label.customer=42``.

``bulk_capable(move)`` gives a one-run command (its ``EXECUTION_ID`` made optional) the
bulk options: repeatable ``--where``, ``--dry-run`` (the count and a sample, nothing
changed), ``--yes`` (a real run needs it), ``--rate 50/s`` and ``--resume OP_ID``; a
command that has ``--dry-run`` or ``--yes`` of its own keeps them for its one run too.
Without ``--where`` or ``--resume`` the command acts on its one run as before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from celery_saga.cli.commands import engine_of, operator_command
from celery_saga.cli.follow import shell_operator
from celery_saga.durations import parse_rate
from celery_saga.worker.bulk import BulkReport

F = TypeVar("F", bound=Callable[..., Any])

_OPTIONS = (
    click.option(
        "--where",
        "where",
        multiple=True,
        metavar="KEY=VALUE",
        help="Act on every run matching (repeatable): saga=, version=, state=, step=, "
        "error~TEXT, older=1h, label.KEY=.",
    ),
    click.option("--rate", help="At most this many runs acted on, e.g. 50/s or 600/m."),
    click.option("--resume", "resume_op", metavar="OP_ID", help="Carry on a bulk operation."),
)
_OWN = {
    "dry_run": click.option(
        "--dry-run", is_flag=True, help="With --where: print the count and a sample only."
    ),
    "yes": click.option("--yes", is_flag=True, help="Do not ask for confirmation."),
}


def bulk_capable(move: str) -> Callable[[F], F]:
    """Give the command of ``move`` (a name in ``worker.bulk_moves.MOVES``) the bulk options."""

    def wrap(command: F) -> F:
        params = getattr(command, "__click_params__", [])
        added = [name for name in _OWN if name not in {p.name for p in params}]

        @functools.wraps(command)
        def run(execution_id: str | None = None, **kwargs: Any) -> Any:
            where, rate = kwargs.pop("where"), kwargs.pop("rate")
            resume_op = kwargs.pop("resume_op")
            if not where and resume_op is None:
                if execution_id is None:
                    raise click.UsageError("give an EXECUTION_ID, or --where terms for many runs")
                # A flag only a bulk move reads must not be dropped silently on one run.
                for name in ("rate", *added):
                    flag = rate if name == "rate" else kwargs.pop(name)
                    if flag:
                        option = "--" + name.replace("_", "-")
                        raise click.UsageError(f"{option} goes with --where (many runs)")
                return command(execution_id=execution_id, **kwargs)
            if execution_id is not None:
                raise click.UsageError("give an EXECUTION_ID or --where, not both")
            if where and resume_op is not None:
                raise click.UsageError("--resume carries on an operation with its own --where")
            options = {**kwargs, "rate": None if rate is None else parse_rate(rate)}
            operator_command(_run)(click.get_current_context(), move, where, resume_op, **options)
            return None

        for name in added:
            run = _OWN[name](run)
        for option in _OPTIONS:
            run = option(run)
        return run  # type: ignore[return-value]

    return wrap


def _run(
    ctx: click.Context,
    move: str,
    where: tuple[str, ...],
    resume_op: str | None,
    *,
    dry_run: bool,
    yes: bool,
    rate: float | None,
    reason: str | None = None,
    **options: str | None,
) -> None:
    engine = engine_of(ctx)
    if dry_run or (not yes and resume_op is None):
        seen = engine.bulk(move, where, dry_run=True)
        click.echo(f"bulk {move} --where {' '.join(where)}: {seen.matched} run(s) match")
        for run, saga, state in seen.sample:
            click.echo(f"  {run}  {saga}  {state}")
        if seen.matched > len(seen.sample):
            click.echo(f"  ... and {seen.matched - len(seen.sample)} more")
        if dry_run:
            click.echo("dry run: nothing changed")
            return
        raise click.ClickException(
            f"a bulk {move} acts on every run that matches; run it again with --yes"
        )
    # The move's own options (an upgrade's --to, a resolve's --step and --note).
    own: dict[str, Any] = {name: value for name, value in options.items() if value is not None}
    done = engine.bulk(
        move,
        where,
        rate=rate,
        actor=shell_operator(),
        reason=reason,
        resume=resume_op,
        progress=_say,
        **own,
    )
    click.echo(
        f"bulk {move} {done.operation_id} finished: {done.acted} acted on, "
        f"{done.refused} refused or unchanged, {done.already} already acted on before"
    )


def _say(report: BulkReport) -> None:
    if not (report.acted or report.refused or report.already):
        click.echo(
            f"bulk {report.move} {report.operation_id} started; if it is interrupted, "
            f"carry it on with --resume {report.operation_id}"
        )
        return
    click.echo(
        f"{report.operation_id}: {report.acted} acted on, {report.refused} refused, "
        f"{report.already} already done",
    )
