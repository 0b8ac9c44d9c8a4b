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

from contextlib import AbstractContextManager

from idemctl.model import (
    Order,
)
from idemctl.stores.postgres import unit
from idemctl.stores.postgres.admin import PostgresAdmin
from idemctl.stores.postgres.core import ADMIN_LOCK_WAIT, PROVISION_LOCK_WAIT
from idemctl.stores.postgres.entities import PostgresEntities
from idemctl.stores.postgres.provision import PostgresProvisioning
from idemctl.stores.postgres.unit import Unit

__all__ = ["ADMIN_LOCK_WAIT", "PROVISION_LOCK_WAIT", "PostgresStore"]


class PostgresStore(PostgresAdmin, PostgresEntities, PostgresProvisioning):
    """PostgreSQL's store: the protocol's steps (``steps``, written from
    ``idemctl.stores.postgres.steps_async``), the operator's operations, the sequence guard's and
    provisioning are its parts (admin, entities, provision); transactional mode is here."""

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
