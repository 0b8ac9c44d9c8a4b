"""Changing records by hand: unlock, forget, purge. Each acts atomically in the store and
looks at a key again before changing it; each has a dry run judged the way the action
judges, on the record as it is now."""

from __future__ import annotations

from typing import TYPE_CHECKING

from idemctl.errors import ConfigError
from idemctl.model import validate_key
from idemctl.operate.results import Action
from idemctl.operate.targets import Target, now
from idemctl.pacing import MAX_RATE, paced

if TYPE_CHECKING:
    from idemctl.model import Record
    from idemctl.powertools.model import PowertoolsRecord
    from idemctl.stores.base import Progress


def unlock(target: Target, key: str, *, force: bool = False, dry_run: bool = False) -> Action:
    """Free ``key``'s lease (a live one only with ``force``): the next delivery claims it at
    once, with the next fencing token."""
    validate_key(key)
    record = target.unlock(key, force, dry_run)
    return _one(target, "unlock", key, dry_run, record)


def forget(target: Target, key: str, *, force: bool = False, dry_run: bool = False) -> Action:
    """Make ``key`` as if never seen (an in-progress one only with ``force``)."""
    validate_key(key)
    record = target.forget(key, force, dry_run)
    return _one(target, "forget", key, dry_run, record)


def forget_entity(
    target: Target, entity: str, *, force: bool = False, dry_run: bool = False
) -> Action:
    """Forget the sequence guard's ``entity`` (a held one only with ``force``): its next
    event applies whatever its sequence."""
    validate_key(entity, "entity")
    found = target.forget_entity(entity, force, dry_run)
    return Action("forget", target.url, dry_run, 1, now(), target.words["forget"], entity=found)


def _one(
    target: Target, action: str, key: str, dry_run: bool, record: Record | PowertoolsRecord
) -> Action:
    words = target.words[action]
    return Action(action, target.url, dry_run, 1, now(), words, keys=[key], record=record)


def unlock_stale(
    target: Target,
    older_than: float = 0.0,
    *,
    dry_run: bool = False,
    progress: Progress | None = None,
    previewed: list[str] | None = None,
) -> Action:
    """Free every lease that ended at least ``older_than`` seconds ago (with ``dry_run``:
    find them). ``previewed``: the keys a dry run found before, to tell those claimed or
    freed meanwhile (``Action.left_alone``)."""
    keys = target.unlock_stale(older_than, dry_run, progress)
    left = sorted(set(previewed) - set(keys)) if previewed is not None else []
    return Action(
        "unlock", target.url, dry_run, len(keys), now(), target.words["unlock"], keys=keys,
        skipped=target.skipped, left_alone=left,
    )  # fmt: skip


def purge(
    target: Target,
    older_than: float = 0.0,
    *,
    dry_run: bool = False,
    progress: Progress | None = None,
    rate: float | None = None,
) -> Action:
    """Delete records past retention by at least ``older_than`` seconds (with ``dry_run``:
    count them), at most ``rate`` a second on average over batches."""
    if rate is not None and not 1 <= rate <= MAX_RATE:
        raise ConfigError(f"--rate {rate:g}: a rate is 1-{MAX_RATE:.0f} records a second")
    if rate is not None and not dry_run:
        progress = paced(rate, progress)
    count = target.purge(older_than, dry_run, progress)
    return Action(
        "purge", target.url, dry_run, count, now(), target.words["purge"], skipped=target.skipped
    )
