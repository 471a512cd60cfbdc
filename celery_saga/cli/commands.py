"""``celery -A proj saga ...``: list, inspect and operate saga runs from a shell.

Celery finds the group through the ``celery.commands`` entry point and hands over its app
as ``ctx.obj.app``; ``python manage.py saga`` (the Django app in
``celery_saga.contrib.django``) runs the same group with the project's app. Every refused
command, and every mistake in a command line (``output.OneLineErrors``), prints one
``Error: ...`` line, exits with status 1 and changes nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import click
from celery import Celery
from sqlalchemy.exc import SQLAlchemyError

from celery_saga.cli.follow import follow_until_ended, shell_operator
from celery_saga.cli.output import OneLineErrors, say_staleness, table
from celery_saga.durations import parse_duration
from celery_saga.errors import SagaError
from celery_saga.inspect import Filters, ListedRun, RunView
from celery_saga.inspect.jsonable import list_json, run_json, stats_json
from celery_saga.inspect.text import run_lines
from celery_saga.records import ExecutionState, RollbackStatus
from celery_saga.runtime.clock import get_clock
from celery_saga.worker.engine import SagaEngine

F = TypeVar("F", bound=Callable[..., Any])


def app_of(ctx: click.Context) -> Celery:
    app = getattr(ctx.obj, "app", None)
    if not isinstance(app, Celery):
        raise click.UsageError("no Celery app: run it as `celery -A proj saga ...`")
    return app


def engine_of(ctx: click.Context) -> SagaEngine:
    """The app's engine, after importing the modules the app lists (where sagas live)."""
    app = app_of(ctx)
    app.loader.import_default_modules()
    return SagaEngine.of(app)


def operator_command(function: F) -> F:
    """Turn refusals into one ``Error:`` line and exit status 1."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except SagaError as error:
            raise click.ClickException(str(error)) from error
        except SQLAlchemyError as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error)
            raise click.ClickException(f"the saga store failed: {first}") from error

    return run  # type: ignore[return-value]


@click.group(name="saga", cls=OneLineErrors)
@click.pass_context
def saga(ctx: click.Context, /, **_preload_options: Any) -> None:
    """Inspect and operate saga runs (list, show, signal, resume, abandon, ...)."""


def _short(when: datetime | None) -> str:
    return "-" if when is None else when.strftime("%Y-%m-%d %H:%M:%S")


def _row(listed: ListedRun) -> list[str]:
    record = listed.record
    return [
        record.id,
        record.saga_name,
        record.state.value,
        record.rollback_status.value if record.rollback_status else "-",
        _short(record.created_at),
        _short(record.updated_at),
        listed.reason,
    ]


_STATES = click.Choice([s.value for s in ExecutionState])
_ROLLBACKS = click.Choice([s.value for s in RollbackStatus])


@saga.command(name="list")
@click.option("--saga", "sagas", multiple=True, help="Only runs of this saga (repeatable).")
@click.option("--state", "states", multiple=True, type=_STATES, help="Repeatable.")
@click.option("--rollback", "rollbacks", multiple=True, type=_ROLLBACKS, help="Repeatable.")
@click.option("--older-than", help="Started at least this long ago (e.g. 30m, 7d).")
@click.option("--newer-than", help="Started at most this long ago.")
@click.option("--archived", is_flag=True, help="List archived runs instead of live ones.")
@click.option(
    "--version", "versions", multiple=True, help="Only runs on this version (hash or label)."
)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000))
@click.option("--cursor", help="Continue after the page that printed this cursor.")
@click.option("--json", "as_json_output", is_flag=True, help="Print JSON.")
@click.pass_context
@operator_command
def list_(
    ctx: click.Context,
    sagas: tuple[str, ...],
    states: tuple[str, ...],
    rollbacks: tuple[str, ...],
    older_than: str | None,
    newer_than: str | None,
    archived: bool,
    versions: tuple[str, ...],
    limit: int,
    cursor: str | None,
    as_json_output: bool,
) -> None:
    """Runs, oldest first, one page at a time."""
    now = get_clock().now()
    reads = engine_of(ctx).inspect()
    filters = Filters(
        saga_names=sagas,
        states=[ExecutionState(s) for s in states],
        rollback_statuses=[RollbackStatus(s) for s in rollbacks],
        created_before=now - parse_duration(older_than) if older_than else None,
        created_after=now - parse_duration(newer_than) if newer_than else None,
        definition_hashes=reads.version_hashes(versions),
    )
    say_staleness(reads.lag())
    page = reads.runs(filters, archived=archived, limit=limit, cursor=cursor)
    if as_json_output:
        click.echo(list_json(page))
        return
    if not page.items:
        click.echo("no runs match")
        return
    headers = ["ID", "SAGA", "STATE", "ROLLBACK", "CREATED", "UPDATED", "REASON"]
    for line in table(headers, [_row(r) for r in page.items]):
        click.echo(line)
    if page.next_cursor:
        click.echo(f"more: --cursor {page.next_cursor}")


@saga.command()
@click.argument("execution_id")
@click.option("--json", "as_json_output", is_flag=True, help="Print JSON.")
@click.option("--reveal", is_flag=True, help="Show the values the saga marks sensitive.")
@click.option(
    "--follow", "follow_run", is_flag=True, help="Then print what happens until the run ends."
)
@click.option("--interval", default=0.5, show_default=True, help="--follow: seconds per poll.")
@click.pass_context
@operator_command
def show(
    ctx: click.Context,
    execution_id: str,
    as_json_output: bool,
    reveal: bool,
    follow_run: bool,
    interval: float,
) -> None:
    """One run's story: its graph with each node's status, then its timeline (steps,
    iterations, reversals, waits, signals, operator actions, child runs)."""
    reads = engine_of(ctx).inspect()
    say_staleness(reads.lag())
    shown = reads.run(execution_id, reveal=reveal)
    if as_json_output:
        click.echo(run_json(shown))
    else:
        click.echo("\n".join(run_lines(shown)))
    if follow_run:
        again = functools.partial(reads.find_run, execution_id, reveal=reveal)
        follow_until_ended(again, shown, click.echo, as_json_output, interval)


@saga.command()
@click.option("--stale-after", help="Idle time before a run counts as lost (default: setting).")
@click.pass_context
@operator_command
def recover(ctx: click.Context, stale_after: str | None) -> None:
    """Run one recovery sweep now (beat runs it on its own)."""
    engine = engine_of(ctx)
    seconds = parse_duration(stale_after).total_seconds() if stale_after else None
    click.echo(f"recovered {engine.recover(seconds, actor=shell_operator())} run(s)")


@saga.command()
@click.option("--older-than", required=True, help="Last updated at least this long ago, e.g. 7d.")
@click.option("--archive", is_flag=True, help="Move them to the archive tables instead.")
@click.pass_context
@operator_command
def cleanup(ctx: click.Context, older_than: str, archive: bool) -> None:
    """Delete (or archive) terminal runs; parked and waiting runs are never touched."""
    age = parse_duration(older_than)
    engine = engine_of(ctx)
    gone = engine.archive(age, actor=shell_operator()) if archive else engine.cleanup(age)
    click.echo(f"{'archived' if archive else 'deleted'} {gone} run(s) older than {older_than}")


@saga.command()
@click.option("--json", "as_json_output", is_flag=True, help="Print JSON.")
@click.option(
    "--all",
    "complete",
    is_flag=True,
    help="Count finished and archived runs too (reads the whole history: slow on a big store).",
)
@click.pass_context
@operator_command
def stats(ctx: click.Context, as_json_output: bool, complete: bool) -> None:
    """Unfinished runs by saga and state, parked runs, and the oldest waiting one."""
    reads = engine_of(ctx).inspect()
    say_staleness(reads.lag())
    found = reads.stats(complete=complete)
    oldest = {
        "waiting": reads.listed(found.oldest_waiting),
        "parked": reads.listed(found.oldest_parked),
    }
    if as_json_output:
        click.echo(stats_json(found, oldest["waiting"], oldest["parked"]))
        return
    by_state: dict[str, int] = {}
    for (_, state), runs in found.counts.items():
        by_state[state] = by_state.get(state, 0) + runs
    rows = [[n, s, str(c)] for (n, s), c in sorted(found.counts.items())]
    for line in table(["SAGA", "STATE", "RUNS"], rows):
        click.echo(line)
    states = ", ".join(f"{s}={c}" for s, c in sorted(by_state.items())) or "none"
    counted = "runs" if found.complete else "unfinished runs"
    archived = "" if found.archived is None else f"; archived: {found.archived}"
    click.echo(f"{counted} by state: {states}{archived}")
    click.echo(f"parked (compensation_stuck): {by_state.get('compensation_stuck', 0)}")
    for label, listed in oldest.items():
        if listed is not None:
            record = listed.record
            since = get_clock().now() - record.updated_at
            click.echo(
                f"oldest {label}: {record.id} ({record.saga_name}) "
                f"since {_short(record.updated_at)} ({since.total_seconds():.0f} s)"
                + _waits_for(listed)
            )


def _waits_for(listed: ListedRun) -> str:
    if listed.waiting_for_version:
        return f", waiting for version {listed.waiting_for_version}"
    if listed.waiting_for_event:
        return f", waiting for signal {listed.waiting_for_event!r}"
    return ""


def live_run(engine: SagaEngine, execution_id: str, *, fresh: bool = False) -> RunView:
    """The run as stored now (its data redacted; ``fresh``: from the store itself, never a
    read replica's older copy); ``ExecutionNotFoundError`` if none."""
    return engine.inspect().run(execution_id, fresh=fresh)
