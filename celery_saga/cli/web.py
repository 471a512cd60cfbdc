"""``celery -A proj saga web``: serve the web view (the ``web`` extra) with waitress."""

from __future__ import annotations

import click

from celery_saga.cli.commands import engine_of, operator_command, saga

_EXTRA = "the web view needs the package's web extra (celery-saga-engine[web])"


@saga.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=5580, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--basic-auth",
    envvar="SAGA_WEB_BASIC_AUTH",
    help="user:password for HTTP basic auth (or SAGA_WEB_BASIC_AUTH).",
)
@click.option("--token", envvar="SAGA_WEB_TOKEN", help="Bearer token (or SAGA_WEB_TOKEN).")
@click.option(
    "--enable-actions",
    is_flag=True,
    envvar="SAGA_WEB_ENABLE_ACTIONS",
    help="Serve the signal, resume, abandon and cancel buttons (needs authentication).",
)
@click.option(
    "--secret",
    envvar="SAGA_WEB_SECRET",
    help="Signs CSRF tokens (or SAGA_WEB_SECRET; default: random per start).",
)
@click.option(
    "--trusted-host",
    "trusted_hosts",
    multiple=True,
    envvar="SAGA_WEB_TRUSTED_HOSTS",
    help="A name requests may give in their Host header besides the address listened on and"
    " loopback's (a proxy's host name); repeatable (or SAGA_WEB_TRUSTED_HOSTS, space-separated).",
)
@click.option("--threads", default=4, show_default=True, type=click.IntRange(1, 64))
@click.pass_context
@operator_command
def web(
    ctx: click.Context,
    host: str,
    port: int,
    basic_auth: str | None,
    token: str | None,
    enable_actions: bool,
    secret: str | None,
    trusted_hosts: tuple[str, ...],
    threads: int,
) -> None:
    """Serve the web view: runs, each run's graph and timeline, and (--enable-actions)
    the operator buttons."""
    try:
        import waitress

        from celery_saga.web import Credentials, WebSettings, create_app
        from celery_saga.web.hosts import exposure_warning
        from celery_saga.web.settings import parse_basic_auth
    except ImportError as error:
        raise click.ClickException(f"{_EXTRA} ({error})") from None
    user = password = None
    if basic_auth:
        try:
            user, password = parse_basic_auth(basic_auth)
        except ValueError as error:
            raise click.UsageError(str(error)) from None
    credentials = Credentials(user, password, token or None)
    trusted = (host, *trusted_hosts)  # the address listened on is the name a browser gives
    settings = WebSettings(credentials, enable_actions, secret, trusted_hosts=trusted)
    try:
        app = create_app(engine_of(ctx), settings)
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    warning = exposure_warning(host, credentials.required)
    if warning is not None:
        click.echo(f"WARNING: {warning}", err=True)
    server = waitress.create_server(app, host=host, port=port, threads=threads)
    where = f"http://{host}:{server.effective_port}/"
    mode = "actions on" if enable_actions else "read-only"
    auth = "no authentication" if not settings.credentials.required else "authentication on"
    click.echo(f"saga web view on {where} ({mode}, {auth})")
    server.run()
