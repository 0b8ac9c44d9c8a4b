"""``postgresql://``: the store whose keys can commit together with the handler's own data.

- ``sql``: the names of the schema's tables and indexes, its migrations, the statements
  (the keys' and the sequence guard's entities')
- ``flows``: the protocol's logic without I/O (generators of statements), which the sync
  store and ``idemctl.aio``'s async one both drive, so they share every statement,
  parameter and row's reading
- ``pool``: the connection pools (sync and async, one set of settings), and the driver's
  errors as idemctl's
- ``transactional``: transactional mode's flows, with the entity's row locked and advanced
  in the same transaction when given an order
- ``unit``: ``PostgresStore.transaction`` and its ``Unit``, driving those flows (written by
  scripts/unasync.py from ``idemctl.stores.postgres.unit_async``,
  ``async with store.transaction(key)``)
- ``core``: the store's settings, pool and statements; ``steps`` on it: the protocol's
  steps, each a flow driven on a pooled connection, and what a row held by an open
  transaction makes of it (written by scripts/unasync.py from
  ``idemctl.stores.postgres.steps_async``)
- ``admin``, ``entities``, ``provision``: the operator's operations, the entities', and
  provisioning
- ``store``: ``PostgresStore``, of those parts, and its transactional mode

Imported only when a ``postgresql://`` store is opened (``idemctl.stores.open_store``):
importing it loads psycopg.
"""

from idemctl.stores import base
from idemctl.stores.postgres.sql import Names, migrations, names, quote_ident
from idemctl.stores.postgres.store import ADMIN_LOCK_WAIT, PostgresStore
from idemctl.stores.postgres.unit import Unit

BATCH = base.BATCH
"""Rows per statement of unlock-stale and purge. Read from here at every call: it may be set."""

__all__ = [
    "ADMIN_LOCK_WAIT",
    "BATCH",
    "Names",
    "PostgresStore",
    "Unit",
    "migrations",
    "names",
    "quote_ident",
]
