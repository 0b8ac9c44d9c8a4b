"""The transactional outbox: events written in the handler's own PostgreSQL transaction,
relayed to Kafka after they commit, replayed on demand with their original ids.

- ``add(conn, aggregatetype, aggregateid, type, payload)`` / ``ctx.outbox.add(...)``: write
- ``idemctl.outbox.relay.Relay``: publish unpublished rows (``idemctl outbox relay``)
- ``idemctl.outbox.table.OutboxTable``: status, selection for replay, purge
"""

from idemctl.outbox.rows import NoOutbox, outbox_table
from idemctl.outbox.writer import Outbox, add

__all__ = ["NoOutbox", "Outbox", "add", "outbox_table"]
