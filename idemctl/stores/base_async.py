"""The async store: the Store protocol with every operation a coroutine.

``AsyncStore`` runs a sync store's operations in worker threads: what SQLite and memory (in
one thread, as their writes are serialised anyway) and DynamoDB (a pool around boto3) use.
Redis and PostgreSQL subclass it and answer the claim/complete path natively on their async
drivers (``redis.asyncio``, psycopg's async connections); their operator's operations
(scan, stats, unlock, forget, purge, provision, check, the entities') stay on the sync
store in a thread. Both halves build the same commands from the same Lua and SQL.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self, TypeVar, runtime_checkable

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
    Holder,
    Order,
    Provisioning,
    Record,
    RecordPage,
    Settle,
    Stale,
    Stats,
    Status,
)
from idemctl.stores.base import Progress, Store
from idemctl.stores.front_async import AsyncFront

if TYPE_CHECKING:
    from idemctl.stores.waiting import Watch

T = TypeVar("T")


class AsyncStore(AsyncFront):
    """``store``'s operations as coroutines, each run in a worker thread of the store's own
    (``threads`` of them). ``sync`` is the store underneath: the same records, usable from
    sync code and from the CLI."""

    threads: ClassVar[int] = 8

    def __init__(self, sync: Store, *, threads: int | None = None) -> None:
        self.sync = sync
        self.url = sync.url
        self.default_lease = sync.default_lease
        self.default_retention = sync.default_retention
        self._threads = threads or self.threads
        self._executor: ThreadPoolExecutor | None = None

    async def _thread(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in one of the store's worker threads."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                self._threads, thread_name_prefix=f"idemctl-{type(self.sync).__name__}"
            )
        call = functools.partial(fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    # The claim/complete protocol ---------------------------------------------------------------

    async def _claim_many(
        self, requests: Sequence[ClaimRequest], lease: float
    ) -> list[ClaimOutcome]:
        # A store on an async driver answers this natively (as ``_complete`` and the others
        # below).
        return await self._thread(self.sync.claim_many, requests, lease)

    async def _complete(self, c: Completion, retention: float) -> Record:
        return await self._thread(
            self.sync.complete, c.key, c.owner, c.fencing_token, c.result, retention
        )

    async def complete_many(
        self, completions: Sequence[Completion], retention: float | None = None
    ) -> list[bool]:
        return await self._thread(self.sync.complete_many, completions, retention)

    async def _fail(self, held: Holder, error: str, retriable: bool, retention: float) -> Record:
        return await self._thread(
            self.sync.fail, held.key, held.owner, held.fencing_token, error, retriable, retention
        )

    async def extend(
        self, key: str, owner: str, fencing_token: int, lease: float | None = None
    ) -> datetime:
        return await self._thread(self.sync.extend, key, owner, fencing_token, lease)

    async def release(
        self, key: str, owner: str, fencing_token: int, *, handler_ran: bool = True
    ) -> Record:
        return await self._thread(
            self.sync.release, key, owner, fencing_token, handler_ran=handler_ran
        )

    async def get(self, key: str) -> Record | None:
        return await self._thread(self.sync.get, key)

    # The sequence guard --------------------------------------------------------------------------

    async def _guard_many(self, guards: Sequence[Guard], lease: float) -> list[GuardReply]:
        return await self._thread(self.sync.guard_many, guards, lease)

    async def _settle_many(self, settles: Sequence[Settle], retention: float) -> list[bool]:
        return await self._thread(self.sync.settle_many, settles, retention)

    async def finish_many(
        self,
        completions: Sequence[Completion],
        settles: Sequence[Settle],
        retention: float | None = None,
    ) -> list[bool]:
        return await self._thread(self.sync.finish_many, completions, settles, retention)

    async def get_entity(self, entity: str) -> Entity | None:
        return await self._thread(self.sync.get_entity, entity)

    async def scan_entities(
        self, prefix: str | None = None, limit: int = 100, cursor: str | None = None
    ) -> EntityPage:
        return await self._thread(self.sync.scan_entities, prefix, limit, cursor)

    async def count_entities(self) -> int:
        return await self._thread(self.sync.count_entities)

    async def forget_entity(self, entity: str, force: bool = False) -> Entity:
        return await self._thread(self.sync.forget_entity, entity, force)

    # The operator's operations ------------------------------------------------------------------

    async def scan(
        self,
        status: Status | None = None,
        stale_only: bool = False,
        prefix: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        older_than: float = 0.0,
        released_only: bool = False,
    ) -> RecordPage:
        return await self._thread(
            self.sync.scan, status, stale_only, prefix, limit, cursor, older_than, released_only
        )

    async def stats(self, exact: bool = False) -> Stats:
        return await self._thread(self.sync.stats, exact)

    async def unlock(self, key: str, force: bool = False) -> Record:
        return await self._thread(self.sync.unlock, key, force)

    async def unlock_stale(
        self, older_than: float = 0.0, *, dry_run: bool = False, progress: Progress | None = None
    ) -> list[str]:
        return await self._thread(
            self.sync.unlock_stale, older_than, dry_run=dry_run, progress=progress
        )

    async def forget(self, key: str, force: bool = False) -> Record:
        return await self._thread(self.sync.forget, key, force)

    async def purge(
        self, older_than: float = 0.0, *, dry_run: bool = False, progress: Progress | None = None
    ) -> int:
        return await self._thread(self.sync.purge, older_than, dry_run=dry_run, progress=progress)

    async def provision(self, dry_run: bool = False) -> Provisioning:
        return await self._thread(self.sync.provision, dry_run)

    async def check(self) -> list[Finding]:
        return await self._thread(self.sync.check)

    async def watch(self) -> Watch:
        """The sync store's waiters (``wait=``): one watch for both APIs in a process, made
        in a thread (the first time, Redis subscribes and PostgreSQL connects to LISTEN)."""
        return await self._thread(self.sync.watch)

    # Lifetime -------------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the store: its async connections, then the sync store in its thread."""
        await self._thread(self.sync.close)
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


class AsyncTransactionUnit(Protocol):
    """One key inside an open transaction (``AsyncTransactionalStore.transaction``)."""

    outcome: ClaimOutcome | Stale
    connection: Any
    """The transaction's async connection while the key is Acquired."""

    async def complete(self, result: JSON = None, retention: float | None = None) -> Record: ...


@runtime_checkable
class AsyncTransactionalStore(Protocol):
    """An async store whose claim, the handler's SQL and completion share one transaction."""

    outbox_table: str

    def transaction(
        self,
        key: str,
        fingerprint: str | None = None,
        lease: float | None = None,
        order: Order | None = None,
    ) -> AbstractAsyncContextManager[AsyncTransactionUnit]: ...
