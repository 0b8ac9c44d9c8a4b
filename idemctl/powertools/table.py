"""What every Powertools table offers the operator, on top of three primitives a backend
writes (``_read``, ``_records``, ``_delete``): look (get, scan, stats), and repair with
Powertools' own semantics: delete a record by a condition checked in the store, never write
a status Powertools does not know.

Each repair is one conditional delete; where the condition fails, the record that failed it
says why (a live invocation, a blocked record, a completed one), as idemctl's own stores
answer an unlock."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Self

from idemctl.errors import KeyNotFound, NotPowertools, Refused
from idemctl.model import Finding
from idemctl.powertools.model import (
    COMPLETED,
    INPROGRESS,
    Layout,
    PowertoolsPage,
    PowertoolsRecord,
    PowertoolsStats,
    State,
)

Progress = Callable[[int], None]

BATCH = 100
"""Keys per progress step of ``unlock_stale`` and ``purge``."""

SHOWN = 5
"""Keys a doctor finding names."""

SAMPLE = 100
"""Items read to judge whether a table is Powertools' at all, before anything else."""


class Rule(StrEnum):
    """The condition a delete is made on, checked by the store at the delete."""

    UNLOCK = "unlock"
    """INPROGRESS, and its in-progress expiry before the cutoff (ms) or the record expired."""
    UNLOCK_FORCE = "unlock_force"
    """INPROGRESS, whatever its expiries."""
    FORGET = "forget"
    """COMPLETED, or expired."""
    FORGET_FORCE = "forget_force"
    """Any record."""
    PURGE = "purge"
    """``expiration`` before the cutoff (s)."""


@dataclass(frozen=True)
class Delete:
    """One conditional delete: ``rule`` at ``now``; ``cutoff`` the moment the expiry the
    rule reads must be before (``now`` unless ``--older-than`` moves it back)."""

    key: str
    rule: Rule
    now: datetime
    cutoff: datetime
    partition: str | None = None
    """On a DynamoDB table with a sort key: the record's partition, where the URL gives no
    ``static_pk_value`` (a sweep over every partition)."""


class PowertoolsTable(ABC):
    """A Powertools idempotency table (DynamoDB) or database (Redis), for operator commands.
    It never claims: ``idemctl.stores.open_store`` refuses this layout."""

    url: str
    """The URL, redacted."""
    layout: Layout

    # The backend's part --------------------------------------------------------------------

    @abstractmethod
    def _read(self, key: str) -> PowertoolsRecord | None: ...

    @abstractmethod
    def _items(
        self, prefix: str | None, limit: int | None = None
    ) -> Iterator[list[PowertoolsRecord]]:
        """Every item whose key starts with ``prefix`` (about ``limit`` of them at most), a
        batch at a time, each read as a record: one with ``problems`` where the item is no
        record Powertools wrote. Powertools' own helper keys are left out."""

    @abstractmethod
    def _delete(self, d: Delete) -> tuple[bool, PowertoolsRecord | None]:
        """Delete ``d.key`` if it is a Powertools record and ``d.rule`` holds in the store:
        (deleted, the record as it was; the one that failed the condition, or None when
        there was none)."""

    @abstractmethod
    def check(self) -> list[Finding]: ...

    def _shape(self) -> str | None:
        """What is wrong with the table's own shape for this layout (DynamoDB's key schema),
        or None."""
        return None

    def close(self) -> None:  # noqa: B027 - a backend with nothing to close needs no override
        pass

    skipped = 0
    """Items the last walk of ``_records`` passed over as no Powertools records."""

    _vouched = False

    def _records(self, prefix: str | None) -> Iterator[list[PowertoolsRecord]]:
        """The Powertools records among ``_items``, counting the other items in
        ``skipped``: nothing but a record Powertools wrote is ever listed, counted or
        deleted."""
        self.vouch()
        self.skipped = 0
        for batch in self._items(prefix):
            records = [r for r in batch if r.is_powertools]
            self.skipped += len(batch) - len(records)
            yield records

    def vouch(self) -> None:
        """Refuse a table that is none of Powertools': a DynamoDB key schema other than the
        layout's, or a sample of its first items none of which is a Powertools record
        (another application's table, or the wrong attribute names in the URL). Checked once,
        before anything is read further or written: ``NotPowertools``."""
        if self._vouched:
            return
        wrong = self._shape()
        if wrong is not None:
            raise NotPowertools(f"{self.url}: {wrong}; nothing read or written")
        sample = [r for batch in self._items(None, SAMPLE) for r in batch][:SAMPLE]
        if sample and not any(r.is_powertools for r in sample):
            first = sample[0]
            raise NotPowertools(
                f"{self.url}: none of the {len(sample)} item(s) read is a Powertools record "
                f"({first.key!r}: {'; '.join(first.problems)}): another application's data, "
                "or Powertools' under other names (key_attr, status_attr, expiry_attr, ... in "
                "the URL); nothing written"
            )
        self._vouched = True

    # Looking -------------------------------------------------------------------------------

    def get(self, key: str) -> PowertoolsRecord | None:
        """The record of ``key`` as stored, in any state (an expired one included; an item
        that is no Powertools record with ``problems`` saying why)."""
        self.vouch()
        return self._read(key)

    def scan(
        self,
        states: set[State] | None = None,
        prefix: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> PowertoolsPage:
        """Records in key order, in ``states`` (every one but expired when None), after
        ``cursor``. Powertools keeps no index: each page reads every record under
        ``prefix``."""
        at = now()
        wanted = states or set(State) - {State.EXPIRED}
        found = sorted(
            (
                r
                for batch in self._records(prefix)
                for r in batch
                if r.state(at) in wanted and (cursor is None or r.key > cursor)
            ),
            key=lambda r: r.key,
        )
        page = found[: max(limit, 0)]
        more = len(found) > len(page) and page
        return PowertoolsPage(page, page[-1].key if more else None)

    def stats(self) -> PowertoolsStats:
        at = now()
        counts = dict.fromkeys(State, 0)
        for batch in self._records(None):
            for r in batch:
                counts[r.state(at)] += 1
        return PowertoolsStats(counts, skipped=self.skipped)

    # Repairing -----------------------------------------------------------------------------

    def unlock(self, key: str, force: bool = False, *, dry_run: bool = False) -> PowertoolsRecord:
        """Delete ``key``'s in-progress record, as Powertools does when the function raises:
        its next call runs the function. One whose invocation may still run (its in-progress
        expiry ahead) or that has none (blocked) needs ``force``. ``dry_run``: the delete's
        condition judged on the record as it is now, nothing deleted."""
        return self._delete_one(key, "unlock", force, dry_run)

    def forget(self, key: str, force: bool = False, *, dry_run: bool = False) -> PowertoolsRecord:
        """Delete ``key``'s completed (or expired) record: its next call runs the function
        again. An in-progress one needs ``force``. ``dry_run`` as ``unlock``'s."""
        return self._delete_one(key, "forget", force, dry_run)

    def _delete_one(self, key: str, action: str, force: bool, dry_run: bool) -> PowertoolsRecord:
        if dry_run:
            record = self.get(key)
            if record is None:
                raise KeyNotFound(key)
            at = now()
            if not holds(rule_of(action, force), record, at, at):
                raise why_not(key, record, at, action, force)
            return record
        at = self._deletable(key, action, force)
        done, old = self._delete(Delete(key, rule_of(action, force), at, at))
        if done and old is not None:
            return old
        raise why_not(key, old, at, action, force)

    def _deletable(self, key: str, action: str, force: bool) -> datetime:
        """Refuse to delete ``key`` where it is no Powertools record, as read now (the
        delete's own condition checks its status and expiry again in the store); the
        moment of the delete."""
        self.vouch()
        old = self._read(key)
        at = now()
        if old is not None and not old.is_powertools:
            raise why_not(key, old, at, action, force)
        return at

    def unlock_stale(
        self, older_than: float = 0.0, *, dry_run: bool = False, progress: Progress | None = None
    ) -> list[str]:
        """Delete every stale record (in progress, its in-progress expiry at least
        ``older_than`` seconds past): the keys deleted, or with ``dry_run`` found. Never a
        completed, blocked or live one: each delete checks again in the store."""
        return self._sweep(Rule.UNLOCK, older_than, dry_run, progress, State.STALE)

    def purge(
        self, older_than: float = 0.0, *, dry_run: bool = False, progress: Progress | None = None
    ) -> int:
        """Delete the records past ``expiration`` (by at least ``older_than`` seconds): how
        many, or with ``dry_run`` how many would be. DynamoDB's TTL and Redis's expiry do
        this by themselves; purge is for a table without TTL, or now."""
        return len(self._sweep(Rule.PURGE, older_than, dry_run, progress))

    def _sweep(
        self,
        rule: Rule,
        older_than: float,
        dry_run: bool,
        progress: Progress | None,
        state: State | None = None,
    ) -> list[str]:
        """Delete by ``rule`` every record it holds for (and in ``state``, if given) with
        the cutoff ``older_than`` seconds back, a batch of keys at a time; the keys deleted
        (with ``dry_run``: found)."""
        at = now()
        cutoff = at - timedelta(seconds=older_than)
        found = [
            r
            for batch in self._records(None)
            for r in batch
            if (state is None or r.state(at) is state) and holds(rule, r, at, cutoff)
        ]
        if dry_run:
            return [r.key for r in found]
        deleted = []
        for i in range(0, len(found), BATCH):
            batch = found[i : i + BATCH]
            deleted += [
                r.key
                for r in batch
                if self._delete(Delete(r.key, rule, at, cutoff, r.partition))[0]
            ]
            if progress is not None:
                progress(len(batch))
        return deleted

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


def now() -> datetime:
    return datetime.now(UTC)


def rule_of(action: str, force: bool) -> Rule:
    """The rule ``unlock`` or ``forget`` (with ``force`` or not) deletes by."""
    return Rule(f"{action}_force" if force else action)


def holds(rule: Rule, r: PowertoolsRecord, at: datetime, cutoff: datetime) -> bool:
    """Whether ``rule`` lets ``r`` be deleted at ``at``: the condition each backend checks
    in the store (a DynamoDB condition expression, a Lua script), for ``--dry-run``."""
    expired = r.expiration is not None and int(r.expiration.timestamp()) < int(at.timestamp())
    if rule is Rule.UNLOCK:
        ended = r.in_progress_expiration is not None and r.in_progress_expiration < cutoff
        return r.status == INPROGRESS and (ended or expired)
    if rule is Rule.UNLOCK_FORCE:
        return r.status == INPROGRESS
    if rule is Rule.FORGET:
        return r.status == COMPLETED or expired
    if rule is Rule.FORGET_FORCE:
        return True
    return r.expiration is not None and int(r.expiration.timestamp()) < int(cutoff.timestamp())


def why_not(
    key: str, old: PowertoolsRecord | None, at: datetime, action: str, force: bool = False
) -> Exception:
    """Why the delete of ``action`` (with ``force`` or not) left ``old``, the record that
    failed its condition."""
    if old is None:
        return KeyNotFound(key)
    if not old.is_powertools:  # no rule deletes it, --force included
        return Refused(
            f"{key!r} is not a Powertools record ({'; '.join(old.problems)}): left alone"
        )
    state = old.state(at)
    if action == "forget":  # only an in-progress record fails forget's condition
        return Refused(
            f"{key!r} is in progress ({state.value}): unlock frees it; --force deletes it "
            "anyway, even while its invocation runs"
        )
    if old.status == COMPLETED:
        return Refused(f"{key!r} is completed, not in progress: forget deletes it")
    if old.status != INPROGRESS or force:
        return Refused(
            f"{key!r} has status {old.status!r}, not {INPROGRESS}: forget --force deletes it"
        )
    if state is State.BLOCKED:
        until = "its expiration" if old.expiration is None else _stamp(old.expiration)
        return Refused(
            f"{key!r} is blocked: in progress with no in-progress expiry (no Lambda context "
            f"was registered), so Powertools refuses its payload until {until}. Once you know "
            "its invocation is gone (the function's logs), --force deletes it"
        )
    until = "-" if old.in_progress_expiration is None else _stamp(old.in_progress_expiration)
    return Refused(
        f"{key!r} is held by a live invocation until {until} (its in-progress expiry): "
        "--force deletes it anyway, and the invocation's result is then lost"
    )


def records_findings(table: PowertoolsTable) -> list[Finding]:
    """``doctor``'s reading of every record: blocked ones (the ones operators need), stale
    ones, and items Powertools would refuse."""
    at = now()
    keys: dict[State, list[str]] = {s: [] for s in State}
    skipped = 0
    example = None
    for batch in table._items(None):
        for r in batch:
            if r.is_powertools:
                keys[r.state(at)].append(r.key)
            else:
                skipped += 1
                example = example or r
    total = sum(map(len, keys.values()))
    if example is not None and not total:
        return [
            Finding(
                "records",
                False,
                f"none of the {skipped} item(s) is a Powertools record ({example.key!r}: "
                f"{'; '.join(example.problems)}): every command but doctor refuses this table",
                "check the table's name and the URL's attribute names (key_attr, status_attr, "
                "expiry_attr, ...) against the persistence layer's arguments",
            )
        ]
    findings = [
        Finding("records", True, f"{total} record(s) read; {skipped} other item(s) skipped")
    ]
    if keys[State.BLOCKED]:
        findings.append(
            Finding(
                "blocked",
                True,
                f"{len(keys[State.BLOCKED])} record(s) in progress with no in-progress expiry: "
                f"their payloads fail until expiration ({_named(keys[State.BLOCKED])})",
                "register the Lambda context (config.register_lambda_context(context)); once "
                "an invocation is known gone, idemctl unlock KEY --force",
                warning=True,
            )
        )
    if keys[State.STALE]:
        findings.append(
            Finding(
                "stale",
                True,
                f"{len(keys[State.STALE])} record(s) whose invocation ended in progress: "
                f"the next call takes each over ({_named(keys[State.STALE])})",
                "idemctl unlock --stale frees them now",
                warning=True,
            )
        )
    if example is not None:
        findings.append(
            Finding(
                "other items",
                True,
                f"{skipped} item(s) are no Powertools records ({example.key!r}: "
                f"{'; '.join(example.problems)}): every command passes them over",
                "idemctl inspect KEY says what one is; idemctl never deletes them",
                warning=True,
            )
        )
    return findings


def _named(keys: list[str]) -> str:
    shown = ", ".join(sorted(keys)[:SHOWN])
    return shown + (f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else "")


def _stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"
