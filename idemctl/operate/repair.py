"""Changing records by hand: unlock, forget, purge. Each acts atomically in the store and
looks at a key again before changing it; each has a dry run judged the way the action
judges, on the record as it is now."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from idemctl.errors import IdemctlError, KeyNotFound, OptionError, Refused
from idemctl.model import Entity, Record, iso_time, validate_key
from idemctl.operate.results import Action
from idemctl.operate.targets import Target, now
from idemctl.pacing import MAX_RATE, paced

if TYPE_CHECKING:
    from idemctl.powertools.model import PowertoolsRecord
    from idemctl.stores.base import Progress


def unlock(
    target: Target,
    key: str,
    *,
    force: bool = False,
    dry_run: bool = False,
    expect: Mapping[str, Any] | None = None,
) -> Action:
    """Free ``key``'s lease (a live one only with ``force``): the next delivery claims it at
    once, with the next fencing token. ``expect``: the record's state as a dry run showed
    it (``state_of``); if it is another now, ``Changed`` is raised and nothing is done."""
    validate_key(key)
    if expect is not None and not dry_run:
        check_state(key, target.get(key), expect)
    record = target.unlock(key, force, dry_run)
    return _one(target, "unlock", key, dry_run, record)


def forget(
    target: Target,
    key: str,
    *,
    force: bool = False,
    dry_run: bool = False,
    expect: Mapping[str, Any] | None = None,
) -> Action:
    """Make ``key`` as if never seen (an in-progress one only with ``force``). ``expect``
    as ``unlock``'s."""
    validate_key(key)
    if expect is not None and not dry_run:
        check_state(key, target.get(key), expect)
    record = target.forget(key, force, dry_run)
    return _one(target, "forget", key, dry_run, record)


def forget_entity(
    target: Target,
    entity: str,
    *,
    force: bool = False,
    dry_run: bool = False,
    expect: Mapping[str, Any] | None = None,
) -> Action:
    """Forget the sequence guard's ``entity`` (a held one only with ``force``): its next
    event applies whatever its sequence. ``expect`` as ``unlock``'s, for the entity."""
    validate_key(entity, "entity")
    if expect is not None and not dry_run:
        check_state(entity, target.get_entity(entity), expect, "entity")
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
    only: Mapping[str, Mapping[str, Any]] | None = None,
) -> Action:
    """Free every lease that ended at least ``older_than`` seconds ago (with ``dry_run``:
    find them). ``previewed``: the keys a dry run found before, to tell those claimed or
    freed meanwhile (``Action.left_alone``). ``only``: the keys a dry run found, each with
    its state then (``state_of``): only those still in that state are freed, every other
    key is left alone, and those of ``only`` that changed are ``left_alone``."""
    if only is not None and not dry_run:
        outcomes = unlock_each(target, only, progress=progress)
        return Action(
            "unlock", target.url, False, sum(o.done for o in outcomes), now(),
            target.words["unlock"], keys=[o.key for o in outcomes if o.done],
            skipped=target.skipped, left_alone=[o.key for o in outcomes if not o.done],
        )  # fmt: skip
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
        raise OptionError("rate", f"{rate:g}: a rate is 1-{MAX_RATE:.0f} records a second")
    if rate is not None and not dry_run:
        progress = paced(rate, progress)
    count = target.purge(older_than, dry_run, progress)
    return Action(
        "purge", target.url, dry_run, count, now(), target.words["purge"], skipped=target.skipped
    )


# Bound to a preview ---------------------------------------------------------------------
# A front end that shows a dry run and acts on the operator's confirmation of it (the
# console) passes back the state each key had in that dry run: the action acts only where
# the record is still in that state, so that a confirmation never acts on what its preview
# never showed. The state is compared right before the store's own action, which keeps its
# own checks (a live lease, an in-progress key, a held entity are refused atomically).

BATCH = 50
"""Keys read at once (``get_many``) before each is acted on, in ``unlock_each`` and
``forget_each``: the time between a key's check and its action stays one batch's."""


def state_of(found: Record | PowertoolsRecord | Entity) -> dict[str, Any]:
    """What a confirmation is bound to: a record's status, fencing token, attempts and
    lease end (Powertools': its status and expiries); an entity's last sequence, the key
    that applied it and the key (and token) holding it. Equal states: the same attempt,
    as the preview showed it."""
    if isinstance(found, Record):
        return {
            "status": found.status.value,
            "fencing_token": found.fencing_token,
            "attempts": found.attempts,
            "lease_expires_at": iso_time(found.lease_expires_at),
        }
    if isinstance(found, Entity):
        return {
            "sequence": found.sequence,
            "key": found.key,
            "holder": found.holder,
            "holder_token": found.holder_token,
        }
    return {
        "status": found.status,
        "expiration": iso_time(found.expiration),
        "in_progress_expiration": iso_time(found.in_progress_expiration),
    }


def describe(state: Mapping[str, Any] | None, other: Mapping[str, Any] | None = None) -> str:
    """A state in words (``failed with fencing token 7, attempt 2``), with the fields that
    differ from ``other`` where only those tell two states apart (a lease's end)."""
    if state is None:
        return "gone (no record)"
    if "sequence" in state:
        held = state.get("holder")
        words = f"at sequence {state['sequence']}"
        words += (f", held by key {held!r} (token {state.get('holder_token')})" if held
                  else ", held by no key")  # fmt: skip
        if other is not None and state.get("key") != other.get("key"):
            words += f", applied by key {state.get('key')!r}"
        return words
    if "fencing_token" in state:
        words = (
            f"{state['status']} with fencing token {state['fencing_token']}, "
            f"attempt {state['attempts']}"
        )
        lease = state.get("lease_expires_at")
        if other is not None and lease != other.get("lease_expires_at"):
            words += f", lease ending {lease}" if lease else ", no lease"
        return words
    words = f"{state.get('status')}, expiring {state.get('expiration')}"
    if state.get("in_progress_expiration"):
        words += f", in progress until {state['in_progress_expiration']}"
    return words


def what_changed(previewed: Mapping[str, Any], current: Mapping[str, Any] | None) -> str:
    """``previewed as failed with fencing token 7, attempt 2; now completed with fencing
    token 8, attempt 3``."""
    return f"previewed as {describe(previewed, current)}; now {describe(current, previewed)}"


class Changed(Refused):
    """The record (or entity) is no longer in the state a dry run showed: nothing was done.
    ``previewed`` and ``now`` are ``state_of``'s (``now`` None: it is gone)."""

    def __init__(
        self,
        name: str,
        previewed: Mapping[str, Any],
        current: Mapping[str, Any] | None,
        noun: str = "key",
        record: Record | None = None,
    ) -> None:
        super().__init__(
            f"{noun} {name!r} changed since its preview, nothing was done: "
            f"{what_changed(previewed, current)}",
            record,
        )
        self.name, self.noun = name, noun
        self.previewed, self.now = dict(previewed), None if current is None else dict(current)


def check_state(
    name: str,
    found: Record | PowertoolsRecord | Entity | None,
    expected: Mapping[str, Any],
    noun: str = "key",
) -> None:
    """Changed unless ``found`` is in the ``expected`` state."""
    current = None if found is None else state_of(found)
    if current != dict(expected):
        raise Changed(name, expected, current, noun, found if isinstance(found, Record) else None)


@dataclass(frozen=True)
class KeyOutcome:
    """What came of one key of ``unlock_each`` or ``forget_each``: ``done``, or why it was
    left alone (``said``), with its state when it was looked at (None: gone)."""

    key: str
    done: bool
    said: str
    now: dict[str, Any] | None = None


def unlock_each(
    target: Target,
    expected: Mapping[str, Mapping[str, Any]],
    *,
    progress: Progress | None = None,
) -> list[KeyOutcome]:
    """Free each key of ``expected`` that is still in the state given (``state_of``), as
    ``unlock`` without force frees it; leave alone each one that changed or that unlock
    refuses. Never touches a key not in ``expected``."""
    return _each(target, expected, "freed", lambda key: target.unlock(key, False, False), progress)


def forget_each(
    target: Target,
    expected: Mapping[str, Mapping[str, Any]],
    *,
    progress: Progress | None = None,
) -> list[KeyOutcome]:
    """Forget each key of ``expected`` still in the state given, as ``forget`` without
    force; the others left alone, as ``unlock_each``."""
    return _each(target, expected, "forgot", lambda key: target.forget(key, False, False), progress)


def _each(
    target: Target,
    expected: Mapping[str, Mapping[str, Any]],
    verb: str,
    action: Callable[[str], object],
    progress: Progress | None,
) -> list[KeyOutcome]:
    keys = list(expected)
    for key in keys:
        validate_key(key)
    outcomes: list[KeyOutcome] = []
    for start in range(0, len(keys), BATCH):
        batch = keys[start : start + BATCH]
        found = _read_many(target, batch)
        for key in batch:
            record = found.get(key)
            current = None if record is None else state_of(record)
            if current != dict(expected[key]):
                said = "left alone: " + what_changed(expected[key], current)
                outcomes.append(KeyOutcome(key, False, said, current))
                continue
            try:
                action(key)
            except (Refused, KeyNotFound) as exc:
                outcomes.append(KeyOutcome(key, False, f"left alone: {exc}", current))
            except IdemctlError as exc:  # the store failed this one: said, the others go on
                outcomes.append(KeyOutcome(key, False, f"failed: {exc}", current))
            else:
                outcomes.append(KeyOutcome(key, True, verb, current))
        if progress is not None:
            progress(len(batch))
    return outcomes


def _read_many(target: Target, keys: list[str]) -> dict[str, Record | PowertoolsRecord]:
    """The records of ``keys`` there are: one ``get_many`` on idemctl's stores."""
    store = getattr(target, "store", None)
    if store is not None:
        return dict(store.get_many(keys))
    found = {key: target.get(key) for key in keys}
    return {key: record for key, record in found.items() if record is not None}


def states_of(target: Target, keys: list[str]) -> dict[str, dict[str, Any]]:
    """The state (``state_of``) of each of ``keys`` that has a record, for a dry run to
    bind its confirmation to: ``get_many`` a batch at a time on idemctl's stores."""
    for key in keys:
        validate_key(key)
    states: dict[str, dict[str, Any]] = {}
    for start in range(0, len(keys), BATCH):
        batch = keys[start : start + BATCH]
        found = _read_many(target, batch)
        states.update((key, state_of(found[key])) for key in batch if key in found)
    return states
