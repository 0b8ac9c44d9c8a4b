"""The operator's view of the transactional outbox."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from idemctl.outbox.table import OutboxStatus
    from idemctl.stores.base import Store


def outbox_status(store: Store) -> OutboxStatus:
    """Unpublished rows, the oldest one's age and rows failing, per aggregate type."""
    from idemctl.outbox.table import OutboxTable

    return OutboxTable(store).status()
