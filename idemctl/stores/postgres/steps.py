# Written by scripts/unasync.py from idemctl/stores/postgres/steps_async.py.
# Do not edit: change that file and run the script (scripts/test checks the two agree).
"""The protocol's steps on PostgreSQL: each is a flow (``stores.postgres.flows``: the
statements, their parameters and the reading of their rows) driven on a pooled connection,
and what a row that an open transaction holds (transactional mode: LockTimeout) makes of
it: a claim or a guard of that row alone answers Busy, a settle waits for it a while.

Written by scripts/unasync.py from ``idemctl.stores.postgres.steps_async``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
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
from idemctl.stores.postgres.core import ADMIN_LOCK_WAIT, PostgresCore
from idemctl.stores.postgres.drive import drive
from idemctl.stores.postgres.flows import Flow, T
from idemctl.stores.postgres.pool_base import LockTimeout
from idemctl.stores.postgres.sql import lock_wait


class PostgresSteps(PostgresCore):
    """The claim/complete path and the sequence guard's steps, on this store's pool."""

    def _run(self, flow: Flow[T]) -> T:
        """``flow`` on a pooled connection."""
        with self.connection() as conn:
            return drive(conn, flow)

    @contextmanager
    def _on_entities(self) -> Iterator[None]:
        """NotProvisioned that says to upgrade when the schema predates the entities."""
        try:
            yield
        except NotProvisioned:
            older = self.without_entities(self.schema_version())
            if older is not None:
                raise older from None
            raise

    def schema_version(self) -> int:
        """The version of the provisioned schema; 0 when there is none."""
        try:
            return self._run(flows.schema_version(self.statements))
        except NotProvisioned:
            return 0

    def _claim_many(self, requests: Sequence[ClaimRequest], lease: float) -> list[ClaimOutcome]:
        try:
            return self._run(flows.claim(self.statements, requests, lease))
        except LockTimeout:
            if len(requests) == 1:
                return [Busy(None)]
        return [self._claim_many([r], lease)[0] for r in requests]

    def _holding(self, flow: Callable[[], Flow[T]]) -> T:
        """A write of the attempt holding its keys (complete, fail, extend, release). Their
        rows are its own, so the claims' short lock_timeout would only fail it for a moment's
        wait: another commit's turn at the notification queue, an admin command's row lock,
        the table's lock while autovacuum truncates it. Past that timeout (which rolled it
        back) it runs once more in a transaction that waits ADMIN_LOCK_WAIT."""
        try:
            return self._run(flow())
        except LockTimeout:
            pass
        try:
            with self.connection() as conn, conn.transaction():
                conn.execute(lock_wait(ADMIN_LOCK_WAIT))
                return drive(conn, flow())
        except LockTimeout:
            raise StoreError(
                f"PostgreSQL at {self.url}: a lock stayed held for {ADMIN_LOCK_WAIT:g}s; "
                "nothing was written"
            ) from None

    def _complete(self, c: Completion, retention: float) -> Record:
        return self._holding(lambda: flows.complete_one(self.statements, c, retention))

    def complete_many(
        self, completions: Sequence[Completion], retention: float | None = None
    ) -> list[bool]:
        seconds = self.retention_for(retention)
        return self._holding(lambda: flows.complete_many(self.statements, completions, seconds))

    def _fail(self, held: Holder, error: str, retriable: bool, retention: float) -> Record:
        return self._holding(lambda: flows.fail(self.statements, held, error, retriable, retention))

    def extend(
        self, key: str, owner: str, fencing_token: int, lease: float | None = None
    ) -> datetime:
        held = Holder(key, owner, fencing_token)
        seconds = self.lease_for(lease)
        return self._holding(lambda: flows.extend(self.statements, held, seconds))

    def release(
        self, key: str, owner: str, fencing_token: int, *, handler_ran: bool = True
    ) -> Record:
        held = Holder(key, owner, fencing_token)
        return self._holding(lambda: flows.release(self.statements, held, handler_ran))

    def get(self, key: str) -> Record | None:
        return self._run(flows.get(self.statements, key))

    def get_many(self, keys: Sequence[str]) -> dict[str, Record]:
        return self._run(flows.get_many(self.statements, keys)) if keys else {}

    def _guard_many(self, guards: Sequence[Guard], lease: float) -> list[GuardReply]:
        try:
            with self._on_entities():
                return self._run(
                    flows.guard(self.statements, guards, lease, self.default_retention)
                )
        except LockTimeout:
            if len(guards) == 1:
                return [self._guard_blocked(guards[0])]
        return [self._guard_many([g], lease)[0] for g in guards]

    def _guard_blocked(self, g: Guard) -> GuardReply:
        """The reply to a guard whose row an open transaction holds (transactional mode)."""
        with self._on_entities():
            return self._run(flows.reply_unwritten(self.statements, g, self.default_retention))

    def _settle_many(self, settles: Sequence[Settle], retention: float) -> list[bool]:
        try:
            with self._on_entities(), self.connection() as conn:
                return self._settle_on(conn, settles, retention)
        except LockTimeout:
            pass
        try:
            with self._on_entities(), self.connection() as conn, conn.transaction():
                conn.execute(lock_wait(ADMIN_LOCK_WAIT))
                return self._settle_on(conn, settles, retention)
        except LockTimeout:
            raise flows.settle_blocked(settles, ADMIN_LOCK_WAIT) from None

    def _settle_on(
        self, conn: psycopg.Connection[Any], settles: Sequence[Settle], retention: float
    ) -> list[bool]:
        with conn.transaction() if flows.settle_in_transaction(settles) else nullcontext():
            return drive(conn, flows.settle(self.statements, settles, retention))
