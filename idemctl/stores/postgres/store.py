"""PostgresStore: the ``postgresql://`` store whose keys can commit together with the
handler's own data.

Normal mode: every transition is one SQL statement (claim is one ``INSERT ... ON CONFLICT
... DO UPDATE ... WHERE <claimable> RETURNING``; batches go through ``unnest``), on
connections from a psycopg_pool pool with short lock and statement timeouts.

Transactional mode (``store.transaction(key)``): claim, the handler's SQL on the same
connection, outbox rows and complete share one transaction; a crash rolls all of it back.

The sequence guard keeps one row per entity in its own table: guard is one ``INSERT ... ON
CONFLICT ... DO UPDATE ... WHERE <go>`` per batch, settle one ``UPDATE ... FROM unnest``.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import datetime

from idemctl.model import (
    Busy,
    ClaimOutcome,
    ClaimRequest,
    Completion,
    Holder,
    Order,
    Record,
)
from idemctl.stores.postgres import flows, unit
from idemctl.stores.postgres.admin import PostgresAdmin
from idemctl.stores.postgres.core import ADMIN_LOCK_WAIT, PROVISION_LOCK_WAIT
from idemctl.stores.postgres.entities import PostgresEntities
from idemctl.stores.postgres.pool import LockTimeout
from idemctl.stores.postgres.provision import PostgresProvisioning
from idemctl.stores.postgres.unit import Unit

__all__ = ["ADMIN_LOCK_WAIT", "PROVISION_LOCK_WAIT", "PostgresStore"]


class PostgresStore(PostgresAdmin, PostgresEntities, PostgresProvisioning):
    """The protocol's transitions and transactional mode; the operator's operations, the
    sequence guard and provisioning are its parts (admin, entities, provision)."""

    def _claim_many(self, requests: Sequence[ClaimRequest], lease: float) -> list[ClaimOutcome]:
        try:
            return self._run(flows.claim(self._sql, requests, lease))
        except LockTimeout:
            if len(requests) == 1:
                return [Busy(None)]
        # A row of the batch is held by an open transaction: claim one by one, so only
        # that key answers Busy.
        return [self.claim(r.key, r.fingerprint, lease) for r in requests]

    def _complete(self, c: Completion, retention: float) -> Record:
        return self._run(flows.complete_one(self._sql, c, retention))

    def complete_many(
        self, completions: Sequence[Completion], retention: float | None = None
    ) -> list[bool]:
        return self._run(flows.complete_many(self._sql, completions, self.retention_for(retention)))

    def _fail(self, held: Holder, error: str, retriable: bool, retention: float) -> Record:
        return self._run(flows.fail(self._sql, held, error, retriable, retention))

    def extend(
        self, key: str, owner: str, fencing_token: int, lease: float | None = None
    ) -> datetime:
        held = Holder(key, owner, fencing_token)
        return self._run(flows.extend(self._sql, held, self.lease_for(lease)))

    def release(
        self, key: str, owner: str, fencing_token: int, *, handler_ran: bool = True
    ) -> Record:
        held = Holder(key, owner, fencing_token)
        return self._run(flows.release(self._sql, held, handler_ran))

    # The sequence guard ---------------------------------------------------------------------------

    def transaction(
        self,
        key: str,
        fingerprint: str | None = None,
        lease: float | None = None,
        order: Order | None = None,
    ) -> AbstractContextManager[Unit]:
        """Claim ``key`` in a new transaction and keep it open around the block.

        When ``unit.outcome`` is Acquired, run your SQL on ``unit.connection`` and call
        ``unit.complete(result)``: leaving the block commits all of it. An exception, a
        crash or a block that never completes rolls everything back, the claim included.
        Another transaction on the same key meanwhile gets Busy at once: a transaction-level
        advisory lock is tried before the claim, and other claimers wait on the row at most
        lock_timeout. For any other outcome nothing is held and ``unit.connection`` is None.

        With ``order``, the entity's row is locked in the same transaction once the key is
        acquired (another transaction on it: Busy(None) at once, as another attempt's live
        hold from ``guard_many``). An event not newer than the entity's last applied one is
        Stale: its key is completed with a null result and committed before the block, and
        nothing is held. Otherwise ``unit.complete()`` advances the entity too, in the
        transaction: it commits with the handler's SQL or not at all.
        """
        return unit.transaction(self, key, fingerprint, lease, order)

    # Admin ----------------------------------------------------------------------------------------
