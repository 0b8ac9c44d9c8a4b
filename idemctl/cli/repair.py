"""Changing records by hand: unlock, forget, purge. Each acts atomically in the store,
looks at a key again before changing it, and asks before touching more than one key."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, NamedTuple

import typer

from idemctl.cli import powertools, render
from idemctl.cli.common import (
    cli_store,
    command,
    confirm,
    duration,
    emit_json,
    one_of,
    settings,
    store_fields,
    usage_error,
)
from idemctl.errors import ConfigError, EntityNotFound, KeyNotFound
from idemctl.model import Record, validate_key
from idemctl.pacing import MAX_RATE, paced
from idemctl.stores.base import Store
from idemctl.stores.machine import check_forgettable, entity_locked, unlocked

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
    change (judged by this machine's clock) and changes nothing.
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
    current = settings(ctx)
    if key is not None and powertools.wanted(ctx):
        powertools.delete_one(ctx, "unlock", key, force, dry_run)
        return
    if key is not None:
        validate_key(key)
        with cli_store(ctx) as store:
            if dry_run:  # the checks unlock makes, on the record as it is now; no write
                record = unlocked(_existing(store, key), render.now(), force)
            else:
                record = store.unlock(key, force=force)
            report(ctx, "unlock", store.url, [key], record=record, dry_run=dry_run)
        return
    older = duration(older_than, "--older-than")
    words = _words(ctx, "unlock")
    with powertools.swept(ctx) as store:
        found = store.unlock_stale(older, dry_run=True)
        skipped = powertools.skipped(store)
        if dry_run or not found:
            report(ctx, "unlock", store.url, found, dry_run=dry_run, words=words, skipped=skipped)
            return
        with changing(
            ctx, _ask(words, len(found), store.url), yes, "unlocking", len(found)
        ) as advance:
            freed = store.unlock_stale(older, progress=advance)
        report(ctx, "unlock", store.url, freed, words=words, skipped=skipped)
        skipped = len(set(found) - set(freed))
        if skipped and not current.json:
            current.err.print(f"{skipped} key(s) were claimed or freed meanwhile and left alone")


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
    one_of(ctx, key, entity)
    if powertools.wanted(ctx):
        powertools.refuse(ctx, entity=entity)
        assert key is not None
        powertools.delete_one(ctx, "forget", key, force, dry_run)
        return
    if entity is not None:
        _forget_entity(ctx, entity, force, dry_run)
        return
    assert key is not None
    validate_key(key)
    with cli_store(ctx) as store:
        if dry_run:  # the checks forget makes, on the record as it is now; no write
            record = _existing(store, key)
            check_forgettable(record, force)
        else:
            record = store.forget(key, force=force)
        report(ctx, "forget", store.url, [key], record=record, dry_run=dry_run)


def _forget_entity(ctx: typer.Context, entity: str, force: bool, dry_run: bool) -> None:
    validate_key(entity, "entity")
    with cli_store(ctx) as store:
        if dry_run:  # the checks forget_entity makes, on the entity as it is now; no write
            found = store.get_entity(entity)
            if found is None:
                raise EntityNotFound(entity)
            if found.locked(render.now()) and not force:
                raise entity_locked(found)
        else:
            found = store.forget_entity(entity, force=force)
        url = store.url
    current = settings(ctx)
    if current.json:
        emit_json(
            render.action_json(
                "forget", store_fields(ctx, url), dry_run=dry_run, count=1, entity=found
            )
        )
        return
    summary = render.entity_summary(found)
    if dry_run:
        current.out.print(
            f"would forget entity {found.entity!r} ({summary}): "
            "its next event would apply whatever its sequence",
            markup=False,
        )
        current.err.print(f"dry run: nothing changed on {url}", markup=False)
        return
    current.out.print(
        f"forgot entity {found.entity!r} ({summary}): its next event applies whatever its sequence",
        markup=False,
    )


def _existing(store: Store, key: str) -> Record:
    record = store.get(key)
    if record is None:
        raise KeyNotFound(key)
    return record


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
    older = duration(older_than, "--older-than")
    if rate is not None and not 1 <= rate <= MAX_RATE:
        raise ConfigError(f"--rate {rate:g}: a rate is 1-{MAX_RATE:.0f} records a second")
    words = _words(ctx, "purge")
    with powertools.swept(ctx) as store:
        found = store.purge(older, dry_run=True)
        skipped = powertools.skipped(store)
        if dry_run or not found:
            report(
                ctx,
                "purge",
                store.url,
                None,
                count=found,
                dry_run=dry_run,
                words=words,
                skipped=skipped,
            )
            return
        with changing(ctx, _ask(words, found, store.url), yes, "purging", found) as advance:
            pace = advance if rate is None else paced(rate, advance)
            purged = store.purge(older, progress=pace)
        report(ctx, "purge", store.url, None, count=purged, words=words, skipped=skipped)


def _words(ctx: typer.Context, action: str) -> Words:
    return (_POWERTOOLS_DONE if powertools.wanted(ctx) else _DONE)[action]


def _ask(words: Words, n: int, url: str) -> str:
    return words.question.format(n=n, url=url)


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


class Words(NamedTuple):
    """How an action's summary and question read."""

    verb: str
    noun: str
    question: str = ""
    """``{n}`` and ``{url}`` filled in."""


_DONE = {
    "unlock": Words("freed", "lease(s)", "Free {n} stale lease(s) on {url}?"),
    "forget": Words("forgot", "key(s)"),
    "purge": Words(
        "purged", "record(s) past retention", "Delete {n} record(s) past retention on {url}?"
    ),
}

_POWERTOOLS_DONE = {
    "unlock": Words(
        "deleted", "stale record(s)", "Delete {n} stale Powertools record(s) on {url}?"
    ),
    "purge": Words(
        "purged", "expired record(s)", "Delete {n} expired Powertools record(s) on {url}?"
    ),
}


def report(
    ctx: typer.Context,
    action: str,
    url: str,
    keys: list[str] | None,
    *,
    count: int | None = None,
    dry_run: bool = False,
    record: Record | None = None,
    words: Words | None = None,
    skipped: int | None = None,
) -> None:
    """What an action did (or would do): ``schemas/action.schema.json`` with --json.
    ``words``: the verb and noun of the text, where not the action's own; ``skipped``: the
    items a Powertools sweep passed over as none of Powertools'."""
    current = settings(ctx)
    if count is None:
        count = len(keys or [])
    if current.json:
        where = store_fields(ctx, url)
        emit_json(
            render.action_json(
                action,
                where,
                dry_run=dry_run,
                count=count,
                keys=keys,
                record=record,
                skipped=skipped,
            )
        )
        return
    if skipped:
        current.err.print(
            f"{skipped} other item(s) are no Powertools records: left alone", markup=False
        )
    verb, noun, _ = words or _DONE[action]
    if dry_run and record is not None:
        if action == "unlock":
            current.out.print(
                f"would unlock {record.key!r}: fencing token {record.fencing_token}, "
                f"the next claim would get {record.fencing_token + 1}",
                markup=False,
            )
        else:
            current.out.print(
                f"would forget {record.key!r} (it is {record.status.value}): "
                "its next delivery would run the handler again",
                markup=False,
            )
        current.err.print(f"dry run: nothing changed on {url}", markup=False)
        return
    if dry_run:
        for key in keys or []:
            current.out.print(key, markup=False, highlight=False)
        current.err.print(f"dry run: {count} {noun} would be {verb}, on {url}", markup=False)
        return
    if record is not None and action == "unlock":
        current.out.print(
            f"unlocked {record.key!r}: fencing token {record.fencing_token}, "
            f"the next claim gets {record.fencing_token + 1}",
            markup=False,
        )
    elif record is not None:
        current.out.print(
            f"forgot {record.key!r} (it was {record.status.value}): "
            "its next delivery runs the handler again",
            markup=False,
        )
    else:
        listed = f": {render.key_list(keys)}" if keys else ""
        current.out.print(f"{verb} {count} {noun} on {url}{listed}", markup=False)
