"""Looking without changing anything: inspect, list, stats, doctor."""

from __future__ import annotations

from typing import Annotated

import typer

from idemctl.cli import render
from idemctl.cli.common import (
    cli_store,
    command,
    duration,
    emit_json,
    settings,
    store_fields,
    usage_error,
)
from idemctl.cli.exitcodes import ExitCode
from idemctl.errors import ConfigError, InvalidCursor, KeyNotFound, NotProvisioned, StoreUnavailable
from idemctl.model import Finding, Status, validate_key
from idemctl.urls import redact_url

PAGE = 500
"""Records one ``scan`` call fetches for ``list``."""


@command()
def inspect(
    ctx: typer.Context,
    key: Annotated[str, typer.Argument(metavar="KEY", help="The idempotency key")],
) -> None:
    """Show every field of one key's record.

    Status, owner, fencing token, attempts, lease left, age, retention left, fingerprint,
    result and error; exact with --json. A missing key exits 5.
    """
    current = settings(ctx)
    validate_key(key)
    with cli_store(ctx) as store:
        record = store.get(key)
    if record is None:
        raise KeyNotFound(key)
    if current.json:
        emit_json(record.to_json())
    else:
        current.out.print(render.record_detail(record, render.now()))


@command("list")
def list_(
    ctx: typer.Context,
    status: Annotated[
        Status | None, typer.Option("--status", help="Only records in this state")
    ] = None,
    stale: Annotated[
        bool,
        typer.Option("--stale", help="Only in-progress keys whose lease expired and nobody freed"),
    ] = False,
    released: Annotated[
        bool,
        typer.Option(
            "--released", help="Only in-progress keys freed by unlock or release, not yet claimed"
        ),
    ] = False,
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than", metavar="DUR", help="Only keys created at least DUR ago (30s, 5m, 7d)"
        ),
    ] = None,
    prefix: Annotated[
        str | None, typer.Option("--prefix", help="Only keys starting with this")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=0, help="At most this many (0: all)")] = 50,
    cursor: Annotated[
        str | None, typer.Option("--cursor", help="Go on from where the last page stopped")
    ] = None,
) -> None:
    """List records, a page at a time.

    A table, or NDJSON with --json. Keys past retention are left out. --stale shows
    in-progress keys whose owner's lease expired and nobody freed (its worker may be gone):
    what `unlock --stale` frees. --released shows in-progress keys with no owner, freed by
    an unlock or a release: the next delivery claims them.
    """
    if stale and released:
        raise usage_error(ctx, "--released", "a key is either stale or released: pick one")
    current = settings(ctx)
    older = duration(older_than, "--older-than")
    at = render.now()
    shown = []
    remaining = limit or None
    with cli_store(ctx) as store:
        while True:
            try:
                page = store.scan(
                    status=status, stale_only=stale, prefix=prefix, cursor=cursor,
                    older_than=older, limit=PAGE if remaining is None else min(PAGE, remaining),
                    released_only=released,
                )  # fmt: skip
            except InvalidCursor as exc:
                raise usage_error(ctx, "--cursor", str(exc)) from None
            if current.json:
                for record in page.records:
                    emit_json(record.to_json())
            shown += page.records
            cursor = page.cursor
            if remaining is not None:
                remaining -= len(page.records)
            if cursor is None or (remaining is not None and remaining <= 0):
                break
    if not current.json:
        if shown:
            current.out.print(render.records_table(shown, at))
        else:
            current.err.print("no records match")
    if cursor is not None:
        current.err.print(
            f"showing {len(shown)}; for more: idemctl list ... --cursor {cursor!r}",
            markup=False,
        )


@command()
def stats(ctx: typer.Context) -> None:
    """Count records by status, stale and released leases, and the oldest in-progress key's age.

    Stale: in progress, the owner's lease expired and nobody freed it (`unlock --stale`
    frees them). Released: in progress with no owner, waiting for the next delivery.
    """
    current = settings(ctx)
    with cli_store(ctx) as store:
        counts = store.stats()
        url = store.url
    at = render.now()
    if current.json:
        emit_json({**store_fields(ctx, url), **render.stats_json(counts, url, at)})
    else:
        current.out.print(render.stats_table(counts, at))


@command()
def doctor(ctx: typer.Context) -> None:
    """Check the store and say how to fix what is wrong.

    Connection and latency, schema version or Lua scripts, durability settings (Redis
    persistence, SQLite synchronous), DynamoDB TTL, clock skew against the store.
    Each finding is ok, WARN (a trade-off worth knowing: exit 0) or FAIL. Exits 2 when
    the server refuses the credentials or database, 3 when unreachable, 4 when not
    provisioned, 1 for any other problem.
    """
    current = settings(ctx)
    url, source = current.store_url()
    url = redact_url(url)
    findings = [Finding("store", True, f"{url} (from {source})")]
    refused_fix = (
        "check the AWS credentials (environment, profile or role) and the region"
        if url.startswith("dynamodb:")
        else "check the URL's user, password and database name"
    )
    try:
        with cli_store(ctx) as store:  # a cluster client connects as it opens
            try:
                findings += store.check()
            except NotProvisioned as exc:
                findings.append(Finding("schema", False, str(exc), "run 'idemctl init'"))
            except ConfigError as exc:  # refused credentials, no such database
                findings.append(Finding("credentials", False, str(exc), refused_fix))
    except StoreUnavailable as exc:
        findings.append(
            Finding(
                "connection", False, str(exc),
                "is the server running, and are the URL's host, port and credentials right?",
            )
        )  # fmt: skip
    code = _doctor_exit(findings)
    if current.json:
        emit_json(
            {"store": url, "store_source": source, "ok": code is ExitCode.OK,
             "findings": [render.finding_json(f) for f in findings]}
        )  # fmt: skip
    else:
        current.out.print(render.findings_table(findings))
        failed = [f for f in findings if not f.ok]
        warned = [f for f in findings if f.level == "warn"]
        warnings = f", {len(warned)} warning(s)" if warned else ""
        if failed:
            current.err.print(f"[bold red]{len(failed)} problem(s) found[/]{warnings}")
        else:
            current.err.print(f"[green]all checks passed[/]{warnings}")
    if code is not ExitCode.OK:
        raise typer.Exit(int(code))


NOT_PROVISIONED = {"schema", "table", "scripts"}


def _doctor_exit(findings: list[Finding]) -> ExitCode:
    failed = {f.name for f in findings if not f.ok}
    if "credentials" in failed:
        return ExitCode.USAGE
    if "connection" in failed:
        return ExitCode.STORE_UNREACHABLE
    if failed & NOT_PROVISIONED:
        return ExitCode.NOT_PROVISIONED
    return ExitCode.UNEXPECTED if failed else ExitCode.OK
