"""Looking without changing anything: inspect, list, stats, doctor."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from idemctl.cli import powertools, render
from idemctl.cli.common import (
    cli_open,
    command,
    duration,
    emit_json,
    one_of,
    settings,
    store_fields,
    target_opener,
    usage_error,
)
from idemctl.cli.exitcodes import ExitCode
from idemctl.model import Entity, Record, Status
from idemctl.operate.doctor import diagnose
from idemctl.operate.documents import doctor as doctor_document
from idemctl.operate.documents import item as item_document
from idemctl.powertools import PowertoolsRecord

if TYPE_CHECKING:
    from rich.console import RenderableType


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
    from idemctl import operate

    one_of(ctx, key, entity)
    current = settings(ctx)
    with cli_open(ctx, target_opener()) as target:
        if entity is not None:
            found: Entity | Record | PowertoolsRecord = operate.inspect_entity(target, entity)
        else:
            assert key is not None
            found = operate.inspect(target, key)
    at = render.now()
    if current.json:
        emit_json(item_document.document(found, at))
    else:
        current.out.print(_detail(found, at))


def _detail(found: Entity | Record | PowertoolsRecord, at: datetime) -> RenderableType:
    if isinstance(found, Entity):
        return render.entity_detail(found, at)
    if isinstance(found, PowertoolsRecord):
        return powertools.record_detail(found, at)
    return render.record_detail(found, at)


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
    from idemctl import operate

    if entities:
        for flag, used in (
            ("--status", status),
            ("--stale", stale),
            ("--released", released),
            ("--blocked", blocked),
            ("--older-than", older_than),
        ):
            if used:
                raise usage_error(
                    ctx, flag, "filters keys (--entities takes --prefix, --limit, --cursor)"
                )
    query = operate.Query(
        status=status,
        stale=stale,
        released=released,
        blocked=blocked,
        older_than=None if older_than is None else duration(older_than, "--older-than"),
        prefix=prefix,
    )
    current = settings(ctx)
    at = render.now()
    shown: list[Any] = []
    skipped = 0
    with cli_open(ctx, target_opener()) as target:
        pages = (
            operate.entities(target, prefix, limit, cursor)
            if entities
            else operate.records(target, query, limit, cursor)
        )
        for page in pages:
            if current.json:
                for item in page.items:
                    emit_json(item_document.document(item, at))
            shown += page.items
            skipped = page.skipped or 0
            cursor = page.cursor
    what = "entities" if entities else "records"
    if not current.json:
        if not shown:
            current.err.print(f"no {what} match")
        elif entities:
            current.out.print(render.entities_table(shown, at))
        elif isinstance(shown[0], PowertoolsRecord):
            current.out.print(powertools.records_table(shown, at))
        else:
            current.out.print(render.records_table(shown, at))
    if cursor is not None:
        again = "list --entities" if entities else "list"
        current.err.print(
            f"showing {len(shown)}; for more: idemctl {again} ... --cursor {cursor!r}",
            markup=False,
        )
    if skipped:
        current.err.print(
            f"{skipped} other item(s) are no Powertools records: not listed", markup=False
        )


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
    from idemctl import operate
    from idemctl.operate.documents import powertools_stats
    from idemctl.operate.documents import stats as stats_document

    current = settings(ctx)
    with cli_open(ctx, target_opener()) as target:
        counts = operate.stats(target, exact)
    where = store_fields(ctx, target.url)
    if isinstance(counts, operate.Counts):
        if current.json:
            emit_json(stats_document.document(where, counts.stats, counts.at, counts.entities))
        else:
            current.out.print(render.stats_table(counts.stats, counts.at, counts.entities))
    elif current.json:
        emit_json(powertools_stats.document(where, counts))
    else:
        current.out.print(powertools.stats_table(counts))


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
    report = diagnose(url, source, opener=lambda: cli_open(ctx, target_opener()))
    if current.json:
        emit_json(doctor_document.document(report))
    else:
        current.out.print(render.findings_table(report.findings))
        current.err.print(render.doctor_summary(report))
    if report.exit_code is not ExitCode.OK:
        raise typer.Exit(int(report.exit_code))
