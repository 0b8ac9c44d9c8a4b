"""The Store protocol every backend implements, and the shared logic they need not repeat.

Backends that can lock a row, read it and write it back in one transaction (memory,
SQLite) subclass RowStore and get every operation from one state machine here. Backends
whose atomic unit is a script or a statement (Redis, PostgreSQL, DynamoDB) implement the
protocol themselves and must pass the same contract suite.
"""

from __future__ import annotations

import secrets
from abc import abstractmethod
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from threading import Lock
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self, TypeAlias, runtime_checkable

from idemctl.errors import LeaseLost
from idemctl.model import (
    JSON,
    ClaimOutcome,
    ClaimRequest,
    Completion,
    Entity,
    EntityPage,
    Finding,
    Guard,
    GuardReply,
    Order,
    Provisioning,
    Record,
    RecordPage,
    Settle,
    Stale,
    Stats,
    Status,
)
from idemctl.stores.front import Front
from idemctl.stores.limits import (
    DEFAULT_LEASE,
    DEFAULT_RETENTION,
    LEASE_RANGE,
    RETENTION_RANGE,
    in_range,
)
from idemctl.stores.queries import Scan
from idemctl.urls import redact_url

Progress: TypeAlias = Callable[[int], None]
"""Called by long admin operations after each batch with the number of keys it handled."""

BATCH = 500
"""Keys one admin batch (one transaction, script call or statement) handles at most."""


if TYPE_CHECKING:
    from idemctl.stores.waiting import Watch

_WATCHES = Lock()
"""Makes each store's watch once."""


@runtime_checkable
class Store(Protocol):
    """The atomic claim/complete protocol plus the operator's admin operations.

    Durations are seconds. Every state change is atomic in the store itself.
    """

    url: str
    """The store's URL with any password redacted: safe to print."""
    default_lease: float
    default_retention: float
    claim_chunk: ClassVar[int | None]
    """Keys ``consume`` claims in one round trip while the handlers of the keys before them
    run, so the store answers meanwhile; None for a store in this process (nothing to
    overlap, and fewer transactions are cheaper)."""

    def claim(
        self, key: str, fingerprint: str | None = None, lease: float | None = None
    ) -> ClaimOutcome: ...
    def complete(
        self,
        key: str,
        owner: str,
        fencing_token: int,
        result: JSON = None,
        retention: float | None = None,
    ) -> Record: ...
    def fail(
        self,
        key: str,
        owner: str,
        fencing_token: int,
        error: str,
        retriable: bool = True,
        retention: float | None = None,
    ) -> Record: ...
    def extend(
        self, key: str, owner: str, fencing_token: int, lease: float | None = None
    ) -> datetime: ...
    def release(
        self, key: str, owner: str, fencing_token: int, *, handler_ran: bool = True
    ) -> Record: ...
    def claim_many(
        self, requests: Sequence[ClaimRequest], lease: float | None = None
    ) -> list[ClaimOutcome]: ...
    def complete_many(
        self, completions: Sequence[Completion], retention: float | None = None
    ) -> list[bool]: ...
    def get(self, key: str) -> Record | None: ...
    def get_many(self, keys: Sequence[str]) -> dict[str, Record]:
        """The live records of ``keys`` (absent or past retention: not in the answer), in
        as few round trips as the store allows."""
        ...

    def scan(
        self,
        status: Status | None = None,
        stale_only: bool = False,
        prefix: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        older_than: float = 0.0,
        released_only: bool = False,
    ) -> RecordPage:
        """Live records (not past retention), at most ``limit``, created at least
        ``older_than`` seconds ago; ``stale_only``: in-progress keys whose owner's lease
        expired (Record.stale: what ``unlock_stale`` frees); ``released_only``: in-progress
        keys with no owner, waiting for their next delivery (Record.released). Pass
        ``RecordPage.cursor`` back for the next page."""
        ...

    def stats(self, exact: bool = False) -> Stats:
        """Counts by status, stale and released leases, the oldest in-progress key.
        ``exact``: count by reading every record where the store keeps counts otherwise
        (Redis's index, DynamoDB's item count): slow on a large store (Stats.counted_by)."""
        ...

    def unlock(self, key: str, force: bool = False) -> Record: ...
    def unlock_stale(
        self, older_than: float = 0.0, *, dry_run: bool = False, progress: Progress | None = None
    ) -> list[str]:
        """Free every lease that ended at least ``older_than`` seconds ago; the keys freed
        (with ``dry_run``, the keys that would be), sorted. Works in batches, each atomic,
        and calls ``progress(n)`` after each with the number of keys it looked at."""
        ...

    def forget(self, key: str, force: bool = False) -> Record:
        """Make ``key`` as if never seen, so its next delivery runs again; the record as it
        was. What stays is a tombstone past retention that keeps the fencing counter, so
        the next claim gets token + 1; ``purge`` deletes it like any record past retention."""
        ...

    def purge(
        self, older_than: float = 0.0, *, dry_run: bool = False, progress: Progress | None = None
    ) -> int:
        """Delete records whose retention ended at least ``older_than`` seconds ago; how many
        (with ``dry_run``, how many would be). Batches and ``progress`` as ``unlock_stale``."""
        ...

    # The sequence guard: "apply if newer" per entity, checked at claim, advanced at the end.

    def guard_many(self, guards: Sequence[Guard], lease: float | None = None) -> list[GuardReply]:
        """For each attempt (already holding its key): STALE when its sequence is not above
        the entity's last applied one, BUSY while another key's attempt holds the entity,
        else GO: this attempt holds the entity (for ``lease``) until it settles. Asking
        again with the same key and token extends the hold."""
        ...

    def settle_many(self, settles: Sequence[Settle], retention: float | None = None) -> list[bool]:
        """Advance each entity to the settle's sequence (``applied``), or only let it go,
        when that key and token still hold it; False where they no longer do."""
        ...

    def finish_many(
        self,
        completions: Sequence[Completion],
        settles: Sequence[Settle],
        retention: float | None = None,
    ) -> list[bool]:
        """The end of guarded attempts: for each completion whose key has a settle (by
        key), advance the entity and complete the key, both or neither where the store can
        (one transaction or script; else the entity first, so a crash between leaves it
        "applied" and the redelivery stale); completions without a settle are completed as
        ``complete_many`` does. True where the attempt held what it names."""
        ...

    def get_entity(self, entity: str) -> Entity | None: ...
    def scan_entities(
        self, prefix: str | None = None, limit: int = 100, cursor: str | None = None
    ) -> EntityPage:
        """Live entities (not past retention) in name order within a page."""
        ...

    def count_entities(self) -> int: ...
    def forget_entity(self, entity: str, force: bool = False) -> Entity:
        """Remove the entity, so any sequence applies again; refused while an attempt holds
        it, unless ``force`` (that attempt then cannot settle: it loses its lease)."""
        ...

    def provision(self, dry_run: bool = False) -> Provisioning: ...
    def check(self) -> list[Finding]: ...
    def watch(self) -> Watch:
        """This process's waiters on the store's keys in flight (``wait=``)."""
        ...

    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: object) -> None: ...


class TransactionUnit(Protocol):
    """One key inside an open transaction (``TransactionalStore.transaction``)."""

    outcome: ClaimOutcome | Stale
    """Stale: the ``order`` given is not newer than its entity's; the key is completed
    with a null result (committed), and there is nothing to run."""
    connection: Any
    """The transaction's connection while the key is Acquired; run your own SQL on it."""

    def complete(self, result: JSON = None, retention: float | None = None) -> Record:
        """Complete the key in this transaction: it commits with the rest or not at all."""
        ...


@runtime_checkable
class TransactionalStore(Protocol):
    """A store whose claim, the handler's own SQL and completion share one transaction
    (PostgreSQL): ``run(..., transactional=True)`` and ``consume --transactional``."""

    outbox_table: str
    """The outbox table that ``ctx.outbox`` writes to, in the same transaction."""

    def transaction(
        self,
        key: str,
        fingerprint: str | None = None,
        lease: float | None = None,
        order: Order | None = None,
    ) -> AbstractContextManager[TransactionUnit]:
        """With ``order``, the entity's row is locked in the transaction too: stale events
        do not run, and ``complete`` advances the entity in the same transaction."""
        ...


@runtime_checkable
class SelfProvisioning(Protocol):
    """A store that can create its own schema when first opened (SQLite): the CLI's
    admin commands turn that off, so they never create a store by looking at it."""

    auto_provision: bool


def new_owner() -> str:
    """A random owner token for one attempt."""
    return secrets.token_hex(16)


def new_owners(n: int) -> list[str]:
    """``n`` distinct owner tokens, one for each attempt of a batch: 12 random bytes shared
    and a number, in the shape of ``new_owner``'s (one read of the system's randomness)."""
    shared = secrets.token_hex(12)
    return [f"{shared}{i:08x}" for i in range(n)]


def utcnow() -> datetime:
    return datetime.now(UTC)


class BaseStore(Front):
    """What every backend shares: defaults, batch fallbacks, context management."""

    scheme: ClassVar[str]
    claim_chunk: ClassVar[int | None] = 128
    wait_poll: ClassVar[tuple[float, float]] = (0.05, 0.5)
    """A waiter's poller (``wait=``): the first interval between reads of the keys waited
    for, and the longest it backs off to while none moves (seconds)."""
    hinted_poll: ClassVar[tuple[float, float]] = (0.5, 2.0)
    """``wait_poll`` where the store's own notifications (``_listen``) wake waiters: the
    poll is only for a hint that is lost, and for leases that run out."""
    _watch: Watch | None = None

    def __init__(
        self, url: str, *, lease: float = DEFAULT_LEASE, retention: float = DEFAULT_RETENTION
    ) -> None:
        self.url = redact_url(url)
        self.default_lease = in_range("lease", lease, LEASE_RANGE)
        self.default_retention = in_range("retention", retention, RETENTION_RANGE)

    def scan(
        self,
        status: Status | None = None,
        stale_only: bool = False,
        prefix: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        older_than: float = 0.0,
        released_only: bool = False,
    ) -> RecordPage:
        wanted = Scan(status, stale_only, prefix, limit, cursor, older_than, released_only)
        return RecordPage([], None) if wanted.nothing else self._scan_page(wanted)

    @abstractmethod
    def _scan_page(self, scan: Scan) -> RecordPage:
        """``scan`` for filters that can match something."""

    def finish_many(
        self,
        completions: Sequence[Completion],
        settles: Sequence[Settle],
        retention: float | None = None,
    ) -> list[bool]:
        return self._settle_then_complete(completions, settles, retention)

    # One call per item: backends with a cheaper round trip override this.

    def complete_many(
        self, completions: Sequence[Completion], retention: float | None = None
    ) -> list[bool]:
        done = []
        for c in completions:
            try:
                self.complete(c.key, c.owner, c.fencing_token, c.result, retention)
            except LeaseLost:
                done.append(False)
            else:
                done.append(True)
        return done

    def get_many(self, keys: Sequence[str]) -> dict[str, Record]:
        found = {}
        for key in dict.fromkeys(keys):
            record = self.get(key)  # type: ignore[attr-defined]
            if record is not None:
                found[key] = record
        return found

    def watch(self) -> Watch:
        """This process's waiters on the store (``wait=``): made at the first wait, with the
        store's own notifications (``_listen``) started before it is returned."""
        if self._watch is None:
            from idemctl.stores.waiting import Watch

            with _WATCHES:
                if self._watch is None:
                    watch = Watch(self, *self.wait_poll)  # type: ignore[arg-type]
                    watch.listening = self._listen(watch)
                    if watch.listening is not None:
                        watch.poll, watch.max_poll = self.hinted_poll
                    self._watch = watch
        return self._watch

    def _listen(self, watch: Watch) -> Callable[[], None] | None:
        """Send the store's notifications of keys that moved on to ``watch.notify``, from
        now on; returns what stops them. None: no notifications but this process's own."""
        return None

    def _moved(self, keys: Iterable[str]) -> None:
        """Keys completed, failed or let go of in this process: its waiters claim again."""
        if self._watch is not None:
            self._watch.notify(keys)

    def _close_watch(self) -> None:
        if self._watch is not None:
            self._watch.close()

    def close(self) -> None:
        pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
