"""``celery saga db new-key`` and ``celery saga db reencrypt``: payload keys and rotation."""

from __future__ import annotations

import click

from celery_saga.cli.commands import operator_command
from celery_saga.cli.db import _database, _refusal_explained, db
from celery_saga.encryption import new_key
from celery_saga.store.codec import current_codec
from celery_saga.store.reseal import ResealCount, reseal_all


@db.command(name="new-key")
def new_key_command() -> None:
    """Print a fresh 256-bit key for saga_payload_keys."""
    click.echo(new_key())


@db.command()
@click.option("--batch-size", default=500, show_default=True, type=click.IntRange(1, 10_000))
@click.pass_context
@operator_command
def reencrypt(ctx: click.Context, batch_size: int) -> None:
    """Seal every stored payload with the newest payload key.

    Payloads sealed with an older key, or stored before the codec was on, are opened and
    sealed again, a batch per transaction; archived runs included. Run it once every
    process writes with the newest key; then older keys can be removed."""
    database = _database(ctx)
    codec = current_codec()
    if codec is None:
        raise click.UsageError(
            "no payload codec is configured: set saga_payload_keys (or saga_payload_codec)"
        )
    newest = codec.seal(b"")[0]
    click.echo(f"sealing every stored payload with key {newest!r}")

    shown = {"rows": 0}

    def progress(count: ResealCount) -> None:
        seen = sum(count.keys_met.values())
        if seen - shown["rows"] >= 10_000 or seen < shown["rows"]:
            shown["rows"] = seen
            click.echo(f"  {count.table}.{count.column}: {seen} read, {count.resealed} resealed")

    with _refusal_explained(database):
        counts = reseal_all(database, codec, newest, batch_size, progress)
    for count in counts:
        met = ", ".join(f"{key}: {n}" for key, n in sorted(count.keys_met.items())) or "none"
        click.echo(
            f"{count.table}.{count.column}: {count.resealed} resealed, {count.current} already "
            f"on {newest!r}, {count.changed_meanwhile} changed meanwhile (keys met: {met})"
        )
    if any(count.changed_meanwhile for count in counts):
        click.echo("rows changed while this ran: run it again to cover them")
    unreadable: dict[str, int] = {}
    for count in counts:
        for key_id, number in count.unreadable.items():
            unreadable[key_id] = unreadable.get(key_id, 0) + number
    if unreadable:
        named = ", ".join(f"{n} sealed with key {k!r}" for k, n in sorted(unreadable.items()))
        raise click.ClickException(
            f"payloads this process cannot open were left as they are: {named}; add that "
            "key to saga_payload_keys (with the key material it was sealed with) and run again"
        )
