"""The proof on the user's own infrastructure: verify."""

from __future__ import annotations

import signal
from typing import Annotated

import typer
from rich.markup import escape

from idemctl.cli import render
from idemctl.cli.common import (
    command,
    duration,
    emit_json,
    note,
    store_fields,
)
from idemctl.cli.live import LiveStatus
from idemctl.cli.logs import CLI_LOGGER, log_line, print_line
from idemctl.cli.running import (
    BrokersOption,
    KafkaConfigOption,
    LogFormat,
    LogFormatOption,
    kafka_settings,
    use_log_format,
)
from idemctl.drivers import require
from idemctl.operate.documents import verify as verify_document
from idemctl.stores import refuse_powertools
from idemctl.urls import redact_url

HTTP_PANEL = "HTTP API (--http URL)"
"""The help's section of the options only ``--http`` takes."""


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@command()
def verify(
    ctx: typer.Context,
    brokers: BrokersOption = None,
    kafka_config: KafkaConfigOption = None,
    messages: Annotated[
        int,
        typer.Option(
            "--messages", metavar="N", min=10, help="Messages to produce, duplicates included"
        ),
    ] = 20_000,
    duplicates: Annotated[
        float,
        typer.Option(
            "--duplicates",
            metavar="SHARE",
            min=0.0,
            max=0.9,
            help="Share of the messages that repeat an earlier key (half of them in another "
            "partition)",
        ),
    ] = 0.3,
    poison: Annotated[
        int | None,
        typer.Option(
            "--poison",
            metavar="N",
            min=0,
            help="Poison keys planted, each to be dead-lettered  [default: 20, or a tenth of "
            "--messages if fewer]",
            show_default=False,
        ),
    ] = None,
    partitions: Annotated[
        int,
        typer.Option("--partitions", metavar="N", min=1, help="Partitions of the scratch topic"),
    ] = 6,
    consumers: Annotated[
        int,
        typer.Option(
            "--consumers", metavar="N", min=1, help="idemctl consume processes in the group"
        ),
    ] = 3,
    kill_every: Annotated[
        str,
        typer.Option(
            "--kill-every",
            metavar="DUR",
            help=(
                "SIGKILL a random consumer and restart it this often, once a message was "
                "handled since the last kill; 0: never"
            ),
        ),
    ] = "2s",
    rebalance: Annotated[
        bool,
        typer.Option(
            "--rebalance", help="One more consumer joins 1 s in, then leaves and joins every 5 s"
        ),
    ] = False,
    store_pause: Annotated[
        str,
        typer.Option(
            "--store-pause",
            metavar="DUR",
            help="Take the store away for DUR, 3 s in: SIGSTOP of a server on this host "
            "(SQLite: an exclusive lock), or --store-fault-cmd; 0: no fault",
        ),
    ] = "0",
    store_fault_cmd: Annotated[
        str | None,
        typer.Option(
            "--store-fault-cmd",
            metavar="COMMAND",
            help="Shell command that stops and starts the store, {action} being 'stop' then "
            "'start', e.g. 'systemctl {action} redis-server'",
        ),
    ] = None,
    transactional: Annotated[
        bool,
        typer.Option(
            "--transactional",
            help="PostgreSQL: the ledger row commits in the key's transaction (no duplicate "
            "effect allowed)",
        ),
    ] = False,
    fenced: Annotated[
        bool,
        typer.Option(
            "--fenced",
            help="The effect goes through the fence (idemctl.fence) into a ledger of its own "
            "(no duplicate effect allowed, a killed attempt's replaced, a late one refused)",
        ),
    ] = False,
    batch_size: Annotated[
        int,
        typer.Option(
            "--batch-size",
            metavar="N",
            min=1,
            help="consume's --batch-size: a SIGKILL may repeat up to this many effects",
        ),
    ] = 1,
    lease: Annotated[str, typer.Option("--lease", metavar="DUR", help="consume's --lease")] = "5s",
    rate: Annotated[
        float,
        typer.Option(
            "--rate",
            metavar="PER_SECOND",
            min=0.0,
            help="Messages produced a second; 0: all at once",
        ),
    ] = 0.0,
    timeout: Annotated[
        str,
        typer.Option(
            "--timeout",
            metavar="DUR",
            help="Give up (and report what is left) when not drained within DUR; with "
            "--http: wait this long for each connection and answer (there 30s by default)",
        ),
    ] = "10m",
    keep: Annotated[
        bool,
        typer.Option("--keep", help="Leave the scratch topics, keys and logs for a look"),
    ] = False,
    run_id: Annotated[
        str | None,
        typer.Option(
            "--run-id",
            metavar="ID",
            help="Names the scratch topic idemctl-verify-ID and the scratch keys [default: "
            "random]; refused if they exist",
        ),
    ] = None,
    log_format: LogFormatOption = LogFormat.AUTO,
    http: Annotated[
        str | None,
        typer.Option(
            "--http",
            metavar="URL",
            help="Check the Idempotency-Key handling of the running HTTP API at URL instead "
            "(the draft's cases, a verdict each); no store or Kafka is used",
            rich_help_panel=HTTP_PANEL,
        ),
    ] = None,
    method: Annotated[
        str,
        typer.Option(
            "--method", metavar="METHOD", help="The request's method", rich_help_panel=HTTP_PANEL
        ),
    ] = "POST",
    data: Annotated[
        str | None,
        typer.Option(
            "--data",
            metavar="BODY",
            help="The request's body; {uuid} in it is a fresh uuid4 for each case",
            rich_help_panel=HTTP_PANEL,
        ),
    ] = None,
    data_file: Annotated[
        str | None,
        typer.Option(
            "--data-file",
            metavar="FILE",
            help="The request's body from FILE (-: stdin), {uuid} replaced too",
            rich_help_panel=HTTP_PANEL,
        ),
    ] = None,
    header: Annotated[
        list[str] | None,
        typer.Option(
            "--header",
            "-H",
            metavar="'NAME: VALUE'",
            help="A header of the caller's, e.g. Authorization or Content-Type (repeatable; "
            "credentials are shown masked)",
            rich_help_panel=HTTP_PANEL,
        ),
    ] = None,
    second_caller_header: Annotated[
        list[str] | None,
        typer.Option(
            "--second-caller-header",
            metavar="'NAME: VALUE'",
            help="Another caller's header, in place of --header's of that name: checks two "
            "callers' equal keys never meet (repeatable)",
            rich_help_panel=HTTP_PANEL,
        ),
    ] = None,
    key_header: Annotated[
        str,
        typer.Option(
            "--key-header", metavar="NAME", help="The key's header", rich_help_panel=HTTP_PANEL
        ),
    ] = "Idempotency-Key",
    bare_key: Annotated[
        bool,
        typer.Option(
            "--bare-key",
            help="Send keys bare (Stripe's form), not as the draft's \"...\" string",
            rich_help_panel=HTTP_PANEL,
        ),
    ] = False,
    fault_path: Annotated[
        str | None,
        typer.Option(
            "--fault-path",
            metavar="ROUTE",
            help="A path (and query: /...) of the same host that answers the request with a "
            "5xx: checks a 5xx's key is released or its answer stored [default: the 5xx case "
            "is skipped]",
            show_default=False,
            rich_help_panel=HTTP_PANEL,
        ),
    ] = None,
    fault_data: Annotated[
        str | None,
        typer.Option(
            "--fault-data",
            metavar="BODY",
            help="A body the API answers with a 5xx ({uuid} replaced), as --fault-path",
            rich_help_panel=HTTP_PANEL,
        ),
    ] = None,
    concurrency: Annotated[
        int,
        typer.Option(
            "--concurrency",
            metavar="N",
            min=2,
            help="Requests sent at once with one key",
            rich_help_panel=HTTP_PANEL,
        ),
    ] = 5,
    sabotage: Annotated[
        str | None,
        typer.Option("--sabotage", hidden=True, help="Test only: no-claim or lose"),
    ] = None,
) -> None:
    """Prove effectively-once on your own store and brokers, with numbers.

    Makes a scratch topic and scratch keys, produces messages with duplicates and poison,
    runs --consumers `idemctl consume` processes with a recording handler, SIGKILLs and
    restarts them (--kill-every), and checks: no key lost, duplicate effects within the
    mode's guarantee, every poison message dead-lettered. Exit 0 when all hold, 1 when one
    does not; everything it made is removed, also on Ctrl-C, unless --keep.

    With --http URL, checks a running HTTP API instead, with the request given (--method,
    --data, --header): a request without a key, a replay byte for byte, another payload
    with a key, --concurrency duplicates at once, a 5xx (--fault-path), two callers
    (--second-caller-header) and malformed keys, a verdict each. Exit 0 when no point
    fails, 1 when one does, 2 when the URL takes no connection.
    """
    from idemctl.cli.verify_http import HttpOptions, refuse_mixed, run_http

    refuse_mixed(ctx, http is not None)
    if http is not None:
        use_log_format(ctx, log_format)
        given_timeout = ctx.get_parameter_source("timeout")
        options = HttpOptions(
            url=http,
            method=method,
            data=data,
            data_file=data_file,
            header=header or [],
            second_caller_header=second_caller_header or [],
            key_header=key_header,
            bare_key=bare_key,
            fault_path=fault_path,
            fault_data=fault_data,
            concurrency=concurrency,
            timeout=timeout if given_timeout and given_timeout.name == "COMMANDLINE" else None,
        )
        run_http(ctx, options)
        return
    from idemctl.harness.verify import Plan, run_verify

    require("confluent_kafka", "kafka", "idemctl verify")
    current = use_log_format(ctx, log_format)
    url, source = current.store_url()
    refuse_powertools(url)  # before the brokers are tried: it could never run on it
    current.used_source = source
    brokers, kafka = kafka_settings(ctx, brokers, kafka_config)
    plan = Plan(
        store=url,
        brokers=brokers,
        kafka_config=kafka,
        default_store=source == "the default",
        messages=messages,
        duplicates=duplicates,
        poison=min(20, messages // 10) if poison is None else poison,
        partitions=partitions,
        consumers=consumers,
        kill_every=duration(kill_every, "--kill-every"),
        rebalance=rebalance,
        store_pause=duration(store_pause, "--store-pause"),
        store_fault_cmd=store_fault_cmd,
        transactional=transactional,
        fenced=fenced,
        batch_size=batch_size,
        lease=duration(lease, "--lease"),
        rate=rate,
        timeout=duration(timeout, "--timeout"),
        keep=keep,
        run_id=run_id,
        sabotage=sabotage,
    )
    err = current.err
    shown = redact_url(url)
    note(
        current,
        f"store: {shown} (from {source})",
        fields={"store": shown, "store_source": source},
    )
    live = current.live
    status = LiveStatus(
        err,
        "verify",
        verify_document.fields,
        lambda progress: progress.handled,
        live=live,
        every=5.0,
        header={"brokers": brokers},
        log_format=current.progress_format,
    )

    def step(text: str) -> None:
        form = current.progress_format
        if live or form == "text":
            err.print(f"[dim]-[/] {escape(text)}", highlight=False)
        else:
            line = log_line(form, "info", text, logger=CLI_LOGGER)
            print_line(err, line)

    previous = signal.signal(signal.SIGTERM, _interrupt)  # cleans up as Ctrl-C does
    try:
        with status:
            report = run_verify(plan, on_step=step, on_progress=status.update)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if current.json:
        emit_json(verify_document.document(store_fields(ctx, redact_url(url)), report))
    else:
        current.out.print(render.verify_table(report))
        for problem in report.problems:
            note(
                current,
                f"FAILED: {problem}",
                level="error",
                markup=f"[bold red]FAILED:[/] {problem}",
            )
        if report.ok:
            ok = f"{report.guarantee}; nothing lost"
            note(current, f"ok: {ok}", markup=f"[green]ok:[/] {ok}")
    if not report.ok:
        raise typer.Exit(1)
