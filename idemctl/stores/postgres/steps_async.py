"""The protocol's steps on PostgreSQL: each is a flow (``stores.postgres.flows``: the
statements, their parameters and the reading of their rows) driven on a pooled connection,
and what a row that an open transaction holds (transactional mode: LockTimeout) makes of
it: a claim or a guard of that row alone answers Busy, a settle waits for it a while.

This module is the original of ``idemctl.stores.postgres.steps`` (scripts/unasync.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, nullcontext
from datetime import datetime
from typing import Any

import psycopg

from idemctl.errors import NotProvisioned, StoreError
from idemctl.model import (
    Busy,
    ClaimOutcome,
    ClaimRequest,
    Completion,
    Guard,
    GuardReply,
    Holder,
    Record,
    Settle,
)
from idemctl.stores.postgres import flows
from idemctl.stores.postgres.core import ADMIN_LOCK_WAIT
from idemctl.stores.postgres.core_async import AsyncPostgresCore
from idemctl.stores.postgres.drive_async import drive_async
from idemctl.stores.postgres.flows import Flow, T
from idemctl.stores.postgres.pool_base import LockTimeout
from idemctl.stores.postgres.sql import lock_wait


class AsyncPostgresSteps(AsyncPostgresCore):
    """The claim/complete path and the sequence guard's steps, on this store's pool."""

    async def _run(self, flow: Flow[T]) -> T:
        """``flow`` on a pooled connection."""
        async with self.connection() as conn:
            return await drive_async(conn, flow)

    @asynccontextmanager
    async def _on_entities(self) -> AsyncIterator[None]:
        """NotProvisioned that says to upgrade when the schema predates the entities."""
        try:
            yield
        except NotProvisioned:
            older = self.without_entities(await self.schema_version())
            if older is not None:
                raise older from None
            raise

    async def schema_version(self) -> int:
        """The version of the provisioned schema; 0 when there is none."""
        try:
            return await self._run(flows.schema_version(self.statements))
        except NotProvisioned:
            return 0

    # The claim/complete protocol ---------------------------------------------------------------

    async def _claim_many(
        self, requests: Sequence[ClaimRequest], lease: float
    ) -> list[ClaimOutcome]:
        try:
            return await self._run(flows.claim(self.statements, requests, lease))
        except LockTimeout:
            if len(requests) == 1:
                return [Busy(None)]
        # A row of the batch is held by an open transaction: claim one by one, so only
        # that key answers Busy.
        return [(await self._claim_many([r], lease))[0] for r in requests]

    async def _holding(self, flow: Callable[[], Flow[T]]) -> T:
        """A write of the attempt holding its keys (complete, fail, extend, release). Their
        rows are its own, so the claims' short lock_timeout would only fail it for a moment's
        wait: another commit's turn at the notification queue, an admin command's row lock,
        the table's lock while autovacuum truncates it. Past that timeout (which rolled it
        back) it runs once more in a transaction that waits ADMIN_LOCK_WAIT."""
        try:
            return await self._run(flow())
        except LockTimeout:
            pass
        try:
            async with self.connection() as conn, conn.transaction():
                await conn.execute(lock_wait(ADMIN_LOCK_WAIT))
                return await drive_async(conn, flow())
        except LockTimeout:
            raise StoreError(
                f"PostgreSQL at {self.url}: a lock stayed held for {ADMIN_LOCK_WAIT:g}s; "
                "nothing was written"
            ) from None

    async def _complete(self, c: Completion, retention: float) -> Record:
        return await self._holding(lambda: flows.complete_one(self.statements, c, retention))

    async def complete_many(
        self, completions: Sequence[Completion], retention: float | None = None
    ) -> list[bool]:
        seconds = self.retention_for(retention)
        return await self._holding(
            lambda: flows.complete_many(self.statements, completions, seconds)
        )

    async def _fail(self, held: Holder, error: str, retriable: bool, retention: float) -> Record:
        return await self._holding(
            lambda: flows.fail(self.statements, held, error, retriable, retention)
        )

    async def extend(
        self, key: str, owner: str, fencing_token: int, lease: float | None = None
    ) -> datetime:
        held = Holder(key, owner, fencing_token)
        seconds = self.lease_for(lease)
        return await self._holding(lambda: flows.extend(self.statements, held, seconds))

    async def release(
        self, key: str, owner: str, fencing_token: int, *, handler_ran: bool = True
    ) -> Record:
        held = Holder(key, owner, fencing_token)
        return await self._holding(lambda: flows.release(self.statements, held, handler_ran))

    async def get(self, key: str) -> Record | None:
        return await self._run(flows.get(self.statements, key))

    async def get_many(self, keys: Sequence[str]) -> dict[str, Record]:
        return await self._run(flows.get_many(self.statements, keys)) if keys else {}

    # The sequence guard --------------------------------------------------------------------------

    async def _guard_many(self, guards: Sequence[Guard], lease: float) -> list[GuardReply]:
        try:
            async with self._on_entities():
                return await self._run(
                    flows.guard(self.statements, guards, lease, self.default_retention)
                )
        except LockTimeout:
            if len(guards) == 1:
                return [await self._guard_blocked(guards[0])]
        # A row of the batch is held by an open transaction: one by one, so only that item
        # answers BUSY. Items that went already go again: the holder asking again keeps it.
        return [(await self._guard_many([g], lease))[0] for g in guards]

    async def _guard_blocked(self, g: Guard) -> GuardReply:
        """The reply to a guard whose row an open transaction holds (transactional mode)."""
        async with self._on_entities():
            return await self._run(
                flows.reply_unwritten(self.statements, g, self.default_retention)
            )

    async def _settle_many(self, settles: Sequence[Settle], retention: float) -> list[bool]:
        try:
            async with self._on_entities(), self.connection() as conn:
                return await self._settle_on(conn, settles, retention)
        except LockTimeout:
            pass
        # An entity's row is held by an open transaction (transactional mode): it decides
        # whether this holder still holds it, so wait for it a while, as admin commands do.
        try:
            async with self._on_entities(), self.connection() as conn, conn.transaction():
                await conn.execute(lock_wait(ADMIN_LOCK_WAIT))
                return await self._settle_on(conn, settles, retention)
        except LockTimeout:
            raise flows.settle_blocked(settles, ADMIN_LOCK_WAIT) from None

    async def _settle_on(
        self, conn: psycopg.AsyncConnection[Any], settles: Sequence[Settle], retention: float
    ) -> list[bool]:
        # More than one round: in one transaction, so a lock timeout undoes all of them.
        async with conn.transaction() if flows.settle_in_transaction(settles) else nullcontext():
            return await drive_async(conn, flows.settle(self.statements, settles, retention))
