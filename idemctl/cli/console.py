"""The web console for the on-call operator: console."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated

import typer

from idemctl.cli.common import cli_target, command, note, settings, store_fields
from idemctl.cli.running import BrokersOption, KafkaConfigOption, kafka_settings
from idemctl.errors import ConfigError

USERS_ENV = "IDEMCTL_CONSOLE_USERS"


@command()
def console(
    ctx: typer.Context,
    bind: Annotated[
        str, typer.Option("--bind", metavar="HOST:PORT", help="Address and port to listen on")
    ] = "127.0.0.1:8080",
    users: Annotated[
        Path | None,
        typer.Option(
            "--users",
            metavar="FILE",
            help=f"Users, a line each: NAME ROLE HASH (viewer or operator; an argon2 or bcrypt "
            f"hash) [default: ${USERS_ENV}]",
        ),
    ] = None,
    trust_proxy: Annotated[
        list[str] | None,
        typer.Option(
            "--trust-proxy",
            metavar="ADDRESS",
            help="An authenticating proxy's address or network, whose X-Forwarded-User is "
            "believed (repeatable)",
        ),
    ] = None,
    no_auth: Annotated[
        bool, typer.Option("--no-auth", help="No login: only when bound to a loopback address")
    ] = False,
    allow_repair: Annotated[
        bool,
        typer.Option(
            "--allow-repair",
            help="Let operators unlock, forget, purge and replay [default: read-only]",
        ),
    ] = False,
    operator_log: Annotated[
        Path,
        typer.Option(
            "--operator-log", metavar="FILE", help="Where actions are logged (JSON lines)"
        ),
    ] = Path("idemctl-operator.log"),
    tls: Annotated[
        bool, typer.Option("--behind-tls", help="Served over HTTPS (by a proxy): Secure cookies")
    ] = False,
    brokers: BrokersOption = None,
    kafka_config: KafkaConfigOption = None,
    hash_password: Annotated[
        bool,
        typer.Option(
            "--hash-password",
            help="Ask for a password and print its argon2 hash for the users file; serve nothing",
        ),
    ] = False,
) -> None:
    """Serve the web console: the store's keys, entities and actions, in a browser.

    Login is required unless --no-auth on a loopback address. Read-only unless
    --allow-repair; then operators may unlock, forget, purge and replay, each with a dry
    run and a typed confirmation, each written to the operator log. Audits and outbox
    replays reach Kafka at --brokers.
    """
    from idemctl.drivers import require

    for package in ("starlette", "jinja2", "uvicorn", "multipart", "argon2", "bcrypt"):
        require(package, "console", "idemctl console")
    from idemctl.console.auth import Proxy, Users

    if hash_password:
        from idemctl.console.auth import hash_password as hashed

        password = typer.prompt("password", hide_input=True, confirmation_prompt=True)
        typer.echo(hashed(password))
        return

    host, _, port = bind.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--bind {bind!r}: write HOST:PORT")
    loopback = _loopback(host)
    if no_auth and not loopback:
        raise ConfigError("--no-auth only on a loopback address: bind 127.0.0.1, or log in")
    people = None
    if users is not None:
        people = Users.read(users)
    elif os.environ.get(USERS_ENV):
        people = Users.parse(os.environ[USERS_ENV], USERS_ENV)
    if people is None and not no_auth and not trust_proxy:
        raise ConfigError(
            f"no users: give --users FILE or ${USERS_ENV}, --trust-proxy, or --no-auth"
        )
    current = settings(ctx)
    kafka_brokers, kafka = kafka_settings(ctx, brokers, kafka_config)
    from idemctl.console.app import Console, serve
    from idemctl.console.oplog import OperatorLog
    from idemctl.console.views import Where

    with cli_target(ctx) as target:
        where = Where(target, store_fields(ctx, target.url)["store_source"], kafka_brokers, kafka)
        served = Console(
            where, people, Proxy(trust_proxy) if trust_proxy else None, no_auth,
            allow_repair, OperatorLog(operator_log), secure=tls,
        )  # fmt: skip
        note(
            current,
            f"console on http://{bind}/ ({'repairs allowed' if allow_repair else 'read-only'})",
        )
        serve(served, host, int(port))


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
