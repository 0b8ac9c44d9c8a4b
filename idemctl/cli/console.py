"""The web console for the on-call operator: console."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from idemctl.cli.common import (
    Settings,
    cli_open,
    command,
    note,
    settings,
    store_fields,
    target_opener,
)
from idemctl.cli.logs import show_warnings
from idemctl.cli.running import BrokersOption, KafkaConfigOption, _pairs, kafka_settings
from idemctl.errors import ConfigError

if TYPE_CHECKING:
    from idemctl.console.auth import Users

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
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host",
            metavar="NAME[:PORT]",
            help="A Host name the console answers to besides its own (the loopback names, "
            "the bound address, the host name for 0.0.0.0): a proxy's public name "
            "(repeatable); any other gets 421",
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
        Path | None,
        typer.Option(
            "--operator-log",
            metavar="FILE",
            help="Where actions, logins and refusals are logged, each before it is done "
            "(JSON lines) [default: $XDG_STATE_HOME/idemctl/console-operator.log, else "
            "~/.local/state/idemctl/console-operator.log]",
        ),
    ] = None,
    tls: Annotated[
        bool, typer.Option("--behind-tls", help="Served over HTTPS (by a proxy): Secure cookies")
    ] = False,
    brokers: BrokersOption = None,
    kafka_config: KafkaConfigOption = None,
    hash_password: Annotated[
        bool,
        typer.Option(
            "--hash-password",
            help="Ask for a password (on the terminal) and print only its argon2 hash on "
            "stdout, for the users file; serve nothing",
        ),
    ] = False,
) -> None:
    """Serve the web console: the store's keys, entities and actions, in a browser.

    Login is required unless --no-auth on a loopback address. Read-only unless
    --allow-repair; then operators may unlock, forget, purge and replay, each with a dry
    run and a typed confirmation, each written to the operator log before it is done.
    Audits and outbox replays reach Kafka at --brokers.
    """
    from idemctl.drivers import require

    for package in ("starlette", "jinja2", "uvicorn", "multipart", "argon2", "bcrypt"):
        require(package, "console", "idemctl console")
    from idemctl.console.auth import Proxy, Users

    if hash_password:
        from idemctl.console.auth import hash_password as hashed

        # The prompts on stderr (the password itself is read from the terminal): stdout
        # holds the hash alone, for `>> users.txt`.
        password = typer.prompt("password", hide_input=True, confirmation_prompt=True, err=True)
        if not password:
            raise ConfigError("an empty password: type one")
        typer.echo(hashed(password))
        return

    host, _, port = bind.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--bind {bind!r}: write HOST:PORT")
    loopback = _loopback(host)
    if no_auth and not loopback:
        raise ConfigError("--no-auth only on a loopback address: bind 127.0.0.1, or log in")
    current = settings(ctx)
    show_warnings(current, "idemctl.console")  # a users file that went bad, a failed page
    from idemctl.console.hosts import Hosts
    from idemctl.console.oplog import OperatorLog, OperatorLogUnwritable, default_path

    hosts = Hosts.for_bind(host, int(port), allowed_host or [])
    log_path = operator_log if operator_log is not None else _state_folder(default_path())
    oplog = OperatorLog(log_path)
    try:
        oplog.check()  # no log, no console: every action is written before it is done
    except OperatorLogUnwritable as exc:
        raise ConfigError(f"--operator-log {log_path}: cannot be written ({exc.reason})") from None
    people = None
    if users is not None:
        people = Users.read(users)
    elif os.environ.get(USERS_ENV):
        people = Users.parse(os.environ[USERS_ENV], USERS_ENV)
    if people is None and not no_auth and not trust_proxy:
        raise ConfigError(
            f"no users: give --users FILE or ${USERS_ENV}, --trust-proxy, or --no-auth"
        )
    kafka_brokers, kafka = kafka_settings(ctx, brokers, kafka_config)
    configured = bool(brokers) or _bootstrap_configured(current, kafka_config)
    from idemctl.console.app import Console, serve
    from idemctl.console.security import Security
    from idemctl.console.views import Where

    insecure = allow_repair and not loopback and not tls
    _warn(current, bind, loopback, tls, allow_repair, people)

    with cli_open(ctx, target_opener()) as target:
        where = Where(target, store_fields(ctx, target.url)["store_source"], kafka_brokers, kafka)
        served = Console(
            where, people, Proxy(trust_proxy) if trust_proxy else None, no_auth,
            allow_repair, oplog, secure=tls,
            security=Security(hosts=hosts, brokers=configured, insecure=insecure),
        )  # fmt: skip
        note(
            current,
            f"console on http://{bind}/ ({'repairs allowed' if allow_repair else 'read-only'}; "
            f"operator log {log_path})",
        )
        serve(served, host.strip("[]"), int(port))


def _state_folder(path: Path) -> Path:
    """``path``, its folder made (private to the user) when missing."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"--operator-log {path}: its folder cannot be made ({exc.strerror})"
        ) from None
    return path


def _bootstrap_configured(current: Settings, flags: list[str] | None) -> bool:
    """Whether idemctl.yaml's kafka: or --kafka-config names bootstrap.servers."""
    kafka = {**current.loaded_config().kafka_for(current.profile), **_pairs(flags or [])}
    return bool(kafka.get("bootstrap.servers"))


def _warn(
    current: Settings, bind: str, loopback: bool, tls: bool, repair: bool, people: Users | None
) -> None:
    """What the start warns of: plain HTTP off loopback (worst with repairs allowed), and
    bcrypt hashes cheap to guess."""
    if not loopback and not tls:
        what = "repairs are allowed on" if repair else "logins reach"
        note(current, f"warning: {what} a console reachable off this machine over plain HTTP "
             f"(--bind {bind}): passwords, session cookies and results cross the network "
             "readable. Serve it behind TLS and say --behind-tls, or bind a loopback address.",
             level="warning")  # fmt: skip
    from idemctl.console.auth import WEAK_BCRYPT

    weak = people.weak() if people is not None else []
    if weak:
        note(current, f"warning: bcrypt cost below {WEAK_BCRYPT} for {', '.join(weak)} "
             "(htpasswd -B writes 5): a guess costs milliseconds. Make the hash with "
             "htpasswd -B -C 12, or idemctl console --hash-password.", level="warning")  # fmt: skip


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
