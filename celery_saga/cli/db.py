"""``celery saga db``: the store's schema revision, and moving it up or down."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import click
from sqlalchemy.exc import SQLAlchemyError

from celery_saga.cli.commands import app_of, operator_command, saga
from celery_saga.encryption import codec_from_conf
from celery_saga.store import schema
from celery_saga.store.codec import use_codec
from celery_saga.store.database import Database
from celery_saga.store.url_errors import configuration_error
from celery_saga.worker.engine import DEFAULT_STORE_URL, SagaEngine


def _database(ctx: click.Context) -> Database:
    """The engine's store, or (for an app that builds no engine) its ``saga_store_url``."""
    app = app_of(ctx)
    app.loader.import_default_modules()
    engine = getattr(app, "saga_engine", None)
    if isinstance(engine, SagaEngine):
        return engine.db
    use_codec(codec_from_conf(app.conf))
    return Database(app.conf.get("saga_store_url") or DEFAULT_STORE_URL)


@contextmanager
def _refusal_explained(database: Database) -> Iterator[None]:
    """A store that refused the URL (no such database, a bad user or path) says what to
    change, as the engine's own calls do."""
    try:
        yield
    except SQLAlchemyError as error:
        refused = configuration_error(error, database.url)
        if refused is None:
            raise
        raise refused from error


@saga.group()
def db() -> None:
    """The store's schema migrations and its payload keys."""


@db.command()
@click.pass_context
@operator_command
def current(ctx: click.Context) -> None:
    """Print the store's revision and the newest one this version ships."""
    database = _database(ctx)
    with _refusal_explained(database):
        revision = schema.current_revision(database)
    head = schema.head_revision()
    state = "up to date" if revision == head else "behind: run `saga db upgrade`"
    click.echo(
        f"store revision: {revision or 'none (empty store)'}; shipped head: {head} ({state})"
    )


@db.command()
@click.argument("revision", default="head")
@click.pass_context
@operator_command
def upgrade(ctx: click.Context, revision: str) -> None:
    """Migrate the store up to REVISION (default: the newest)."""
    database = _database(ctx)
    with _refusal_explained(database):
        before, after = schema.move(database, revision, down=False)
    click.echo(
        f"store revision: {before or 'none'} -> {after}"
        if before != after
        else f"store already at {after}"
    )


@db.command()
@click.argument("revision")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
@operator_command
def downgrade(ctx: click.Context, revision: str, yes: bool) -> None:
    """Migrate the store down to REVISION ('base' drops every saga table)."""
    database = _database(ctx)
    if not yes:
        click.confirm(
            f"Downgrade the saga store to {revision}? Tables and columns newer than it are "
            "dropped with their data",
            abort=True,
        )
    with _refusal_explained(database):
        before, after = schema.move(database, revision, down=True)
    click.echo(f"store revision: {before or 'none'} -> {after or 'none'}")
