"""Changing records by hand: unlock, forget, purge. Each acts atomically in the store,
looks at a key again before changing it, and asks before touching more than one key."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated

import typer

from idemctl.cli import powertools, render
from idemctl.cli.common import (
    cli_open,
    command,
    confirm,
    duration,
    emit_json,
    one_of,
    settings,
    store_fields,
    target_opener,
    usage_error,
)
from idemctl.operate.documents import action as action_document
from idemctl.powertools import PowertoolsRecord

if TYPE_CHECKING:
    from rich.console import Console

    from idemctl.model import Entity, Record
    from idemctl.operate import Action

DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Show what would change and change nothing")
]
YesOption = Annotated[
    bool, typer.Option("--yes", "-y", help="Do not ask before acting on more than one key")
]


@command()
def unlock(
    ctx: typer.Context,
    key: Annotated[
        str | None, typer.Argument(metavar="KEY", hidden=True, show_default=False)
    ] = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Free a live lease too (its worker may still be running)"),
    ] = False,
    stale: Annotated[
        bool, typer.Option("--stale", help="Free every lease that expired, instead of one KEY")
    ] = False,
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than", metavar="DUR", help="With --stale: leases that expired at least DUR ago"
        ),
    ] = None,
    dry_run: DryRunOption = False,
    yes: YesOption = False,
) -> None:
    """Free a stuck KEY's lease, or every expired lease with --stale.

    The next delivery can claim the key at once. Its fencing token stays, so the next
    claim gets token + 1 and the old owner can no longer complete. A live lease needs
    --force (exit 6 without): its worker may still be running. --dry-run shows what would
    change (judged by this host's clock) and changes nothing.
    """
    if stale == (key is not None):
        raise usage_error(ctx, "KEY", "give a KEY, or --stale to free every expired lease")
    if not stale:
        for flag, used in (("--older-than", older_than), ("--yes", yes)):
            if used:
                raise usage_error(ctx, flag, "goes with --stale")
    elif force:
        raise usage_error(
            ctx, "--force", "--stale frees only expired leases; unlock a live one by KEY"
        )
    from idemctl import operate

    if key is not None:
        with cli_open(ctx, target_opener()) as target:
            report(ctx, operate.unlock(target, key, force=force, dry_run=dry_run))
        return
    older = duration(older_than, "--older-than")
    with cli_open(ctx, target_opener()) as target:
        found = operate.unlock_stale(target, older, dry_run=True)
        if dry_run or not found.keys:
            report(ctx, replace(found, dry_run=dry_run))
            return
        with changing(ctx, _ask(found), yes, "unlocking", found.count) as advance:
            freed = operate.unlock_stale(target, older, progress=advance, previewed=found.keys)
        report(ctx, freed)
    current = settings(ctx)
    if freed.left_alone and not current.json:
        current.err.print(
            f"{len(freed.left_alone)} key(s) were claimed or freed meanwhile and left alone"
        )


@command()
def forget(
    ctx: typer.Context,
    key: Annotated[
        str | None, typer.Argument(metavar="KEY", hidden=True, show_default=False)
    ] = None,
    entity: Annotated[
        str | None,
        typer.Option(
            "--entity",
            metavar="ENTITY",
            help="Forget an entity of the sequence guard instead of a KEY",
            show_default=False,
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Forget an in-progress key, or a held entity, too"),
    ] = False,
    dry_run: DryRunOption = False,
) -> None:
    """Forget KEY so its next delivery runs the handler again, or an ENTITY with --entity.

    For completed or failed keys. An in-progress key needs --force (exit 6 without): its
    worker may still be running. What stays is a tombstone that keeps the key's fencing
    counter (the next claim gets token + 1) until purge. --entity ENTITY forgets the
    sequence guard's entity: its next event applies whatever its sequence. An entity an
    attempt holds needs --force (exit 6 without): that attempt may still be working, and
    can no longer settle. --dry-run shows what would be forgotten and changes nothing.
    """
    from idemctl import operate

    one_of(ctx, key, entity)
    with cli_open(ctx, target_opener()) as target:
        if entity is not None:
            done = operate.forget_entity(target, entity, force=force, dry_run=dry_run)
        else:
            assert key is not None
            done = operate.forget(target, key, force=force, dry_run=dry_run)
    report(ctx, done)


@command()
def purge(
    ctx: typer.Context,
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            metavar="DUR",
            help="Only records whose retention ended at least DUR ago",
        ),
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option(
            "--rate",
            metavar="KEYS/S",
            help="Delete at most this many records a second, on average over batches of "
            "500 (1-1000000), to spare the consumers beside it",
        ),
    ] = None,
    dry_run: DryRunOption = False,
    yes: YesOption = False,
) -> None:
    """Delete records past retention, freeing their space.

    Such records already count as never seen. Redis and DynamoDB expire records by TTL
    themselves, so there it finds little (on Redis: the tombstones `forget` leaves).
    Each batch is its own transaction, script call or request, holding nothing across
    batches; on PostgreSQL it skips rows a claim holds (SKIP LOCKED), so it never waits on
    or deadlocks a consumer. Interrupted (Ctrl-C), it stops after a whole batch: run it
    again for the rest.
    """
    from idemctl import operate

    older = duration(older_than, "--older-than")
    with cli_open(ctx, target_opener()) as target:
        found = operate.purge(target, older, dry_run=True, rate=rate)
        if dry_run or not found.count:
            report(ctx, replace(found, dry_run=dry_run))
            return
        with changing(ctx, _ask(found), yes, "purging", found.count) as advance:
            report(ctx, operate.purge(target, older, progress=advance, rate=rate))


def _ask(found: Action) -> str:
    return found.words.question.format(n=found.count, url=found.url)


@contextmanager
def changing(
    ctx: typer.Context, question: str, yes: bool, what: str, total: int, noun: str = "key(s)"
) -> Iterator[Callable[[int], None]]:
    """Ask ``question`` first where more than one is to change (``confirm``), then a progress
    bar on stderr (on a terminal only); yields what advances it. Interrupted, it says how
    far it got: each batch is atomic, so nothing is left half-changed."""
    if total > 1:
        confirm(ctx, question, yes)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    current = settings(ctx)
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        bar.advance(task, n)

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=current.err,
        transient=True,
        disable=current.json or not current.err.is_terminal,
    ) as bar:
        task = bar.add_task(what, total=total)
        try:
            yield advance
        except KeyboardInterrupt:
            current.err.print(
                f"{what} stopped after {done} of {total} {noun}; each batch was done whole "
                "or not at all: run the command again for the rest"
            )
            raise


def report(ctx: typer.Context, done: Action) -> None:
    """What an action did (or would do): ``schemas/action.schema.json`` with --json."""
    current = settings(ctx)
    if current.json:
        emit_json(action_document.of(done, store_fields(ctx, done.url)))
        return
    if done.skipped:
        current.err.print(
            f"{done.skipped} other item(s) are no Powertools records: left alone", markup=False
        )
    url, dry_run = done.url, done.dry_run
    if done.entity is not None:
        _entity_done(current.out, done.entity, dry_run)
    elif isinstance(done.record, PowertoolsRecord):
        powertools.report_one(ctx, done.action, done.record, done.at, dry_run)
    elif done.record is not None:
        _record_done(current.out, done.action, done.record, dry_run)
    elif dry_run:
        for key in done.keys or []:
            current.out.print(key, markup=False, highlight=False)
        verb, noun, _ = done.words
        current.err.print(f"dry run: {done.count} {noun} would be {verb}, on {url}", markup=False)
        return
    else:
        verb, noun, _ = done.words
        listed = f": {render.key_list(done.keys)}" if done.keys else ""
        current.out.print(f"{verb} {done.count} {noun} on {url}{listed}", markup=False)
    if dry_run:
        current.err.print(f"dry run: nothing changed on {url}", markup=False)


def _record_done(out: Console, action: str, record: Record, dry_run: bool) -> None:
    token = record.fencing_token
    if action == "unlock":
        out.print(
            f"would unlock {record.key!r}: fencing token {token}, the next claim would get "
            f"{token + 1}"
            if dry_run
            else f"unlocked {record.key!r}: fencing token {token}, the next claim gets {token + 1}",
            markup=False,
        )
    elif dry_run:
        out.print(
            f"would forget {record.key!r} (it is {record.status.value}): "
            "its next delivery would run the handler again",
            markup=False,
        )
    else:
        out.print(
            f"forgot {record.key!r} (it was {record.status.value}): "
            "its next delivery runs the handler again",
            markup=False,
        )


def _entity_done(out: Console, entity: Entity, dry_run: bool) -> None:
    summary = render.entity_summary(entity)
    if dry_run:
        out.print(
            f"would forget entity {entity.entity!r} ({summary}): "
            "its next event would apply whatever its sequence",
            markup=False,
        )
    else:
        out.print(
            f"forgot entity {entity.entity!r} ({summary}): its next event applies whatever "
            "its sequence",
            markup=False,
        )
