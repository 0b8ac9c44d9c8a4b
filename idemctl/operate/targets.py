"""What operator actions run on: idemctl's own store, or a table of another layout
(Powertools') that idemctl can look at and repair but never claims in. A layout is a kind
of target here, not a branch in each action: ``open_target`` picks the target once, from
the URL, and each action calls its methods."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, ClassVar, Self

from idemctl.errors import EntityNotFound, KeyNotFound, OptionError
from idemctl.model import Status
from idemctl.operate.results import Counts, Page, Words

if TYPE_CHECKING:
    from idemctl.model import Entity, Finding, Record
    from idemctl.powertools.model import PowertoolsRecord, PowertoolsStats
    from idemctl.powertools.table import PowertoolsTable
    from idemctl.stores.base import Progress, Store


@dataclass(frozen=True)
class Query:
    """Which records ``list`` shows. ``older_than``: seconds since created; ``blocked``:
    Powertools' in-progress records with no in-progress expiry."""

    status: Status | None = None
    stale: bool = False
    released: bool = False
    blocked: bool = False
    older_than: float | None = None
    prefix: str | None = None


def now() -> datetime:
    return datetime.now(UTC)


class Target(ABC):
    """A store as the operator's actions see it; a context manager that closes it."""

    url: str
    """The URL, redacted."""
    layout: str
    """The ``layout=`` of its URL."""
    name: str
    """The layout as the messages name it."""
    words: ClassVar[Mapping[str, Words]]
    """How ``unlock --stale`` and ``purge`` read on this layout."""
    unprovisioned_fix: str
    """What ``doctor`` says to do when the store is not provisioned."""

    # Looking ---------------------------------------------------------------------------

    @abstractmethod
    def get(self, key: str) -> Record | PowertoolsRecord | None: ...

    def get_entity(self, entity: str) -> Entity | None:
        raise self.not_applicable("entity")

    @abstractmethod
    def scan(self, query: Query, size: int, cursor: str | None) -> Page[Record | PowertoolsRecord]:
        """A page of ``size`` records at most matching ``query``, after ``cursor``."""

    def scan_entities(self, prefix: str | None, size: int, cursor: str | None) -> Page[Entity]:
        raise self.not_applicable("entities")

    @abstractmethod
    def stats(self, exact: bool) -> Counts | PowertoolsStats: ...

    @abstractmethod
    def check(self) -> list[Finding]:
        """``doctor``'s checks of the store (NotProvisioned, ConfigError and
        StoreUnavailable raised for ``doctor`` to turn into findings)."""

    # Repairing -------------------------------------------------------------------------

    @abstractmethod
    def unlock(self, key: str, force: bool, dry_run: bool) -> Record | PowertoolsRecord:
        """Free ``key``; with ``dry_run`` the checks judged on the record as it is now,
        nothing written. The record as it was (idemctl's: as it is after)."""

    @abstractmethod
    def forget(self, key: str, force: bool, dry_run: bool) -> Record | PowertoolsRecord: ...

    def forget_entity(self, entity: str, force: bool, dry_run: bool) -> Entity:
        raise self.not_applicable("entity")

    @abstractmethod
    def unlock_stale(
        self, older_than: float, dry_run: bool, progress: Progress | None
    ) -> list[str]: ...

    @abstractmethod
    def purge(self, older_than: float, dry_run: bool, progress: Progress | None) -> int: ...

    @property
    def skipped(self) -> int | None:
        """Items the last sweep passed over as none of this layout's (None: idemctl's own
        layout, where every item is a record)."""
        return None

    # ------------------------------------------------------------------------------------

    def not_applicable(self, option: str) -> OptionError:
        return OptionError(option, f"does not apply to a {self.name} table (layout={self.layout})")

    def refuse(self, **used: object) -> None:
        """OptionError for the first of ``used`` (option -> value) that was given."""
        for option, value in used.items():
            if value:
                raise self.not_applicable(option)

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StoreTarget(Target):
    """idemctl's own layout: a ``Store``."""

    layout = name = "idemctl"
    words: ClassVar[Mapping[str, Words]] = {
        "unlock": Words("freed", "lease(s)", "Free {n} stale lease(s) on {url}?"),
        "forget": Words("forgot", "key(s)"),
        "purge": Words(
            "purged", "record(s) past retention", "Delete {n} record(s) past retention on {url}?"
        ),
    }
    unprovisioned_fix = "run 'idemctl init'"

    def __init__(self, store: Store) -> None:
        self.store = store
        self.url = store.url

    def get(self, key: str) -> Record | None:
        return self.store.get(key)

    def get_entity(self, entity: str) -> Entity | None:
        return self.store.get_entity(entity)

    def scan(self, query: Query, size: int, cursor: str | None) -> Page[Record]:
        if query.blocked:
            raise OptionError("blocked", "is for Powertools tables (layout=powertools)")
        if query.stale and query.released:
            raise OptionError("released", "a key is either stale or released: pick one")
        page = self.store.scan(
            status=query.status,
            stale_only=query.stale,
            prefix=query.prefix,
            cursor=cursor,
            older_than=query.older_than or 0.0,
            limit=size,
            released_only=query.released,
        )
        return Page(page.records, page.cursor)

    def scan_entities(self, prefix: str | None, size: int, cursor: str | None) -> Page[Entity]:
        page = self.store.scan_entities(prefix=prefix, limit=size, cursor=cursor)
        return Page(page.entities, page.cursor)

    def stats(self, exact: bool) -> Counts:
        from idemctl.errors import NotProvisioned

        counts = self.store.stats(exact=exact)
        entities: int | None = None
        try:
            if counts.counted_by != "approximate":  # DynamoDB: counting them is a Scan
                entities = self.store.count_entities()
        except NotProvisioned:  # keys provisioned, the guard's table not yet
            pass
        return Counts(counts, entities, now())

    def check(self) -> list[Finding]:
        from idemctl.outbox.health import outbox_findings

        checks = self.store.check()
        outbox = outbox_findings(self.store)
        # The outbox's findings (PostgreSQL only) after the store's ``schema``.
        at = next((i + 1 for i, f in enumerate(checks) if f.name == "schema"), len(checks))
        return [*checks[:at], *outbox, *checks[at:]]

    def unlock(self, key: str, force: bool, dry_run: bool) -> Record:
        if not dry_run:
            return self.store.unlock(key, force=force)
        from idemctl.stores.machine import unlocked

        return unlocked(self._existing(key), now(), force)  # the checks unlock makes

    def forget(self, key: str, force: bool, dry_run: bool) -> Record:
        if not dry_run:
            return self.store.forget(key, force=force)
        from idemctl.stores.machine import check_forgettable

        record = self._existing(key)
        check_forgettable(record, force)  # the checks forget makes
        return record

    def forget_entity(self, entity: str, force: bool, dry_run: bool) -> Entity:
        if not dry_run:
            return self.store.forget_entity(entity, force=force)
        from idemctl.stores.machine import entity_locked

        found = self.store.get_entity(entity)  # the checks forget_entity makes
        if found is None:
            raise EntityNotFound(entity)
        if found.locked(now()) and not force:
            raise entity_locked(found)
        return found

    def unlock_stale(
        self, older_than: float, dry_run: bool, progress: Progress | None
    ) -> list[str]:
        return self.store.unlock_stale(older_than, dry_run=dry_run, progress=progress)

    def purge(self, older_than: float, dry_run: bool, progress: Progress | None) -> int:
        return self.store.purge(older_than, dry_run=dry_run, progress=progress)

    def _existing(self, key: str) -> Record:
        record = self.store.get(key)
        if record is None:
            raise KeyNotFound(key)
        return record

    def close(self) -> None:
        self.store.close()


class PowertoolsTarget(Target):
    """Powertools for AWS Lambda's layout (``layout=powertools``): its records' states, no
    entities, no released keys; a sweep leaves every item that is none of Powertools'."""

    layout, name = "powertools", "Powertools"
    words: ClassVar[Mapping[str, Words]] = {
        "unlock": Words(
            "deleted", "stale record(s)", "Delete {n} stale Powertools record(s) on {url}?"
        ),
        "forget": Words("forgot", "key(s)"),
        "purge": Words(
            "purged", "expired record(s)", "Delete {n} expired Powertools record(s) on {url}?"
        ),
    }
    unprovisioned_fix = "check the table's name and region in the URL"

    def __init__(self, table: PowertoolsTable) -> None:
        self.table = table
        self.url = table.url

    def get(self, key: str) -> PowertoolsRecord | None:
        return self.table.get(key)

    def scan(self, query: Query, size: int, cursor: str | None) -> Page[PowertoolsRecord]:
        from idemctl.powertools import State

        self.refuse(released=query.released, older_than=query.older_than is not None)
        states: set[State] | None = None
        if query.stale or query.blocked:
            states = {s for s, on in ((State.STALE, query.stale), (State.BLOCKED, query.blocked))
                      if on}  # fmt: skip
        elif query.status is Status.IN_PROGRESS:  # every in-progress state, as on idemctl's
            states = {State.IN_PROGRESS, State.STALE, State.BLOCKED}
        elif query.status is Status.COMPLETED:
            states = {State.COMPLETED}
        elif query.status is Status.FAILED:  # Powertools deletes the record of a failed call
            states = set()
        page = self.table.scan(states, query.prefix, size, cursor)
        return Page(page.records, page.cursor, self.table.skipped)

    def stats(self, exact: bool) -> PowertoolsStats:
        self.refuse(exact=exact)  # it reads every record anyway
        return self.table.stats()

    def check(self) -> list[Finding]:
        return self.table.check()

    def unlock(self, key: str, force: bool, dry_run: bool) -> PowertoolsRecord:
        return self.table.unlock(key, force=force, dry_run=dry_run)

    def forget(self, key: str, force: bool, dry_run: bool) -> PowertoolsRecord:
        return self.table.forget(key, force=force, dry_run=dry_run)

    def unlock_stale(
        self, older_than: float, dry_run: bool, progress: Progress | None
    ) -> list[str]:
        return self.table.unlock_stale(older_than, dry_run=dry_run, progress=progress)

    def purge(self, older_than: float, dry_run: bool, progress: Progress | None) -> int:
        return self.table.purge(older_than, dry_run=dry_run, progress=progress)

    @property
    def skipped(self) -> int | None:
        return self.table.skipped

    def close(self) -> None:
        self.table.close()


def open_target(url: str, *, auto_provision: bool = False) -> Target:
    """The target at ``url``: a Powertools table where it says ``layout=powertools``, else
    idemctl's store. Looking never creates a SQLite database: ``auto_provision`` only where
    the caller uses the store as the library does."""
    from idemctl.powertools import is_powertools, open_table

    if is_powertools(url):
        return PowertoolsTarget(open_table(url))
    from idemctl.stores import open_store
    from idemctl.stores.base import SelfProvisioning

    store = open_store(url)
    if isinstance(store, SelfProvisioning):
        store.auto_provision = auto_provision
    return StoreTarget(store)
