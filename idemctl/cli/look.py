"""Looking without changing anything: inspect, list, stats, doctor."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Annotated, Any, TypeVar

import typer

from idemctl.cli import powertools, render
from idemctl.cli.common import (
    cli_store,
    command,
    duration,
    emit_json,
    one_of,
    settings,
    store_fields,
    usage_error,
)
from idemctl.cli.exitcodes import ExitCode
from idemctl.doctor import Verdict, diagnose
from idemctl.errors import EntityNotFound, InvalidCursor, KeyNotFound, NotProvisioned
from idemctl.model import Entity, Record, Status, validate_key
from idemctl.powertools import PowertoolsRecord
from idemctl.powertools.table import PowertoolsTable
from idemctl.stores.base import Store

PAGE = 500
"""Records one ``scan`` call fetches for ``list``."""


@command()
def inspect(
    ctx: typer.Context,
    key: Annotated[
        str | None, typer.Argument(metavar="KEY", hidden=True, show_default=False)
    ] = None,
    entity: Annotated[
        str | None,
        typer.Option(
            "--entity",
            metavar="ENTITY",
            help="Show an entity of the sequence guard instead of a KEY",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Show every field of KEY's record, or of one ENTITY's with --entity.

    Status, owner, fencing token, attempts, lease left, age, retention left, fingerprint,
    result and error; exact with --json. --entity ENTITY: the sequence guard's last applied
    sequence for it, when and by which key, the attempt holding it now (key, fencing token,
    hold left) and retention left. A missing key or entity exits 5.
    """
    one_of(ctx, key, entity)
    if powertools.wanted(ctx):
        powertools.refuse(ctx, entity=entity)
        assert key is not None
        powertools.inspect(ctx, key)
        return
    current = settings(ctx)
    if entity is not None:
        validate_key(entity, "entity")
        with cli_store(ctx) as store:
            found = store.get_entity(entity)
        if found is None:
            raise EntityNotFound(entity)
        if current.json:
            emit_json(found.to_json())
        else:
            current.out.print(render.entity_detail(found, render.now()))
        return
    assert key is not None
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
    blocked: Annotated[
        bool,
        typer.Option(
            "--blocked",
            help="Powertools tables: only records in progress with no in-progress expiry, "
            "refused until they expire",
        ),
    ] = False,
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than", metavar="DUR", help="Only keys created at least DUR ago (30s, 5m, 7d)"
        ),
    ] = None,
    prefix: Annotated[
        str | None, typer.Option("--prefix", metavar="PREFIX", help="Only keys starting with this")
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", metavar="N", min=0, help="At most this many (0: all)")
    ] = 50,
    cursor: Annotated[
        str | None,
        typer.Option("--cursor", metavar="CURSOR", help="Go on from where the last page stopped"),
    ] = None,
    entities: Annotated[
        bool,
        typer.Option(
            "--entities",
            help="List the sequence guard's entities instead of keys (--prefix, --limit, "
            "--cursor apply)",
        ),
    ] = False,
) -> None:
    """List records, or the sequence guard's entities, a page at a time.

    A table, or NDJSON with --json. Keys past retention are left out. --stale shows
    in-progress keys whose owner's lease expired and nobody freed (its worker may be gone):
    what `unlock --stale` frees. --released shows in-progress keys with no owner, freed by
    an unlock or a release: the next delivery claims them. --entities lists entities in
    name order: the last sequence applied, when, by which key, and the key holding it now.
    """
    if powertools.wanted(ctx):
        powertools.refuse(ctx, released=released, older_than=older_than, entities=entities)
        states = powertools.states_of(status and status.value, stale, blocked)
        skipped = 0

        def found(table: PowertoolsTable, size: int, after: str | None) -> Found[PowertoolsRecord]:
            nonlocal skipped
            page = table.scan(states, prefix, size, after)
            skipped = table.skipped
            return page.records, page.cursor

        at = render.now()
        _pages(
            ctx, found, limit, cursor, powertools.records_table, "records", "list",
            opener=powertools.opened, as_json=lambda r: r.to_json(at),
        )  # fmt: skip
        if skipped:
            settings(ctx).err.print(
                f"{skipped} other item(s) are no Powertools records: not listed", markup=False
            )
        return
    if blocked:
        raise usage_error(ctx, "--blocked", "is for Powertools tables (layout=powertools)")
    if stale and released:
        raise usage_error(ctx, "--released", "a key is either stale or released: pick one")
    if entities:
        for flag, used in (
            ("--status", status),
            ("--stale", stale),
            ("--released", released),
            ("--older-than", older_than),
        ):
            if used:
                raise usage_error(
                    ctx, flag, "filters keys (--entities takes --prefix, --limit, --cursor)"
                )
        _list_entities(ctx, prefix, limit, cursor)
        return
    older = duration(older_than, "--older-than")

    def records(store: Store, size: int, after: str | None) -> tuple[list[Record], str | None]:
        page = store.scan(
            status=status,
            stale_only=stale,
            prefix=prefix,
            cursor=after,
            older_than=older,
            limit=size,
            released_only=released,
        )
        return page.records, page.cursor

    _pages(
        ctx, records, limit, cursor, render.records_table, "records", "list",
        as_json=Record.to_json,
    )  # fmt: skip


Item = TypeVar("Item", Record, Entity, PowertoolsRecord)
Source = TypeVar("Source", Store, PowertoolsTable)
Found = tuple[list[Item], str | None]
"""A page and the cursor that goes on from it."""


def _pages(
    ctx: typer.Context,
    fetch: Callable[[Source, int, str | None], Found[Item]],
    limit: int,
    cursor: str | None,
    table: Callable[[list[Item], datetime], Any],
    what: str,
    again: str,
    *,
    opener: Callable[[typer.Context], AbstractContextManager[Source]] = cli_store,  # type: ignore[assignment]
    as_json: Callable[[Item], Any],
) -> None:
    """What ``list`` shows, keys, entities or Powertools records: ``fetch(source, size,
    cursor)`` a page at a time from what ``opener`` opens, up to ``limit`` (0: all), NDJSON
    with --json (``as_json``) as they come, else one table; on stderr the cursor that goes
    on (``again``: the command to give it to)."""
    current = settings(ctx)
    at = render.now()
    shown: list[Item] = []
    remaining = limit or None
    with opener(ctx) as store:
        while True:
            try:
                found, cursor = fetch(
                    store, PAGE if remaining is None else min(PAGE, remaining), cursor
                )
            except InvalidCursor as exc:
                raise usage_error(ctx, "--cursor", str(exc)) from None
            if current.json:
                for item in found:
                    emit_json(as_json(item))
            shown += found
            if remaining is not None:
                remaining -= len(found)
            if cursor is None or (remaining is not None and remaining <= 0):
                break
    if not current.json:
        if shown:
            current.out.print(table(shown, at))
        else:
            current.err.print(f"no {what} match")
    if cursor is not None:
        current.err.print(
            f"showing {len(shown)}; for more: idemctl {again} ... --cursor {cursor!r}",
            markup=False,
        )


def _list_entities(ctx: typer.Context, prefix: str | None, limit: int, cursor: str | None) -> None:
    """``list --entities``: pages of ``scan_entities``, as ``list`` pages records."""

    def entities(store: Store, size: int, after: str | None) -> tuple[list[Entity], str | None]:
        page = store.scan_entities(prefix=prefix, limit=size, cursor=after)
        return page.entities, page.cursor

    _pages(
        ctx, entities, limit, cursor, render.entities_table, "entities", "list --entities",
        as_json=Entity.to_json,
    )  # fmt: skip


@command()
def stats(
    ctx: typer.Context,
    exact: Annotated[
        bool,
        typer.Option(
            "--exact",
            help="Count by reading every record, where the store keeps counts otherwise "
            "(Redis's index, DynamoDB's item count): slow on a large store.",
        ),
    ] = False,
) -> None:
    """Count records by status, stale and released leases, the oldest in-progress key's age,
    and the sequence guard's entities.

    Stale: in progress, the owner's lease expired and nobody freed it (`unlock --stale`
    frees them). Released: in progress with no owner, waiting for the next delivery.
    Entities: those the sequence guard keeps a last applied sequence for (none counted,
    `-` or null, on a store provisioned before the guard: `idemctl init` adds it).
    """
    if powertools.wanted(ctx):
        powertools.refuse(ctx, exact=exact)  # it reads every record anyway
        powertools.stats(ctx)
        return
    current = settings(ctx)
    with cli_store(ctx) as store:
        counts = store.stats(exact=exact)
        entities: int | None = None
        try:
            if counts.counted_by != "approximate":  # DynamoDB: counting them is a Scan
                entities = store.count_entities()
        except NotProvisioned:  # keys provisioned, the guard's table not yet
            pass
        url = store.url
    at = render.now()
    if current.json:
        emit_json(render.stats_json(store_fields(ctx, url), counts, at, entities))
    else:
        current.out.print(render.stats_table(counts, at, entities))


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
    report = diagnose(url, source, opener=lambda: powertools.swept(ctx))
    if current.json:
        emit_json(render.doctor_json(report))
    else:
        current.out.print(render.findings_table(report.findings))
        current.err.print(render.doctor_summary(report))
    code = DOCTOR_EXIT[report.verdict]
    if code is not ExitCode.OK:
        raise typer.Exit(int(code))


DOCTOR_EXIT = {
    Verdict.OK: ExitCode.OK,
    Verdict.REFUSED: ExitCode.USAGE,
    Verdict.UNREACHABLE: ExitCode.STORE_UNREACHABLE,
    Verdict.NOT_PROVISIONED: ExitCode.NOT_PROVISIONED,
    Verdict.PROBLEM: ExitCode.UNEXPECTED,
}
