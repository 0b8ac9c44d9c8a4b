"""What the brokers know, for an operator choosing what to look at: the consumer groups and
the topics of a Kafka cluster (an audit's group and topic), and the outbox rows waiting to
be published (a replay's row)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from idemctl.audit.names import Known
    from idemctl.outbox.table import OutboxRow
    from idemctl.stores.base import Store


def known(brokers: str, kafka_config: Mapping[str, str], timeout: float = 3.0) -> Known:
    """The groups and topics the cluster at ``brokers`` lists (``idemctl.audit.names``)."""
    from idemctl.audit.names import known as listed

    return listed(brokers, kafka_config, timeout)


def outbox_pending(store: Store, limit: int, failing: bool = False) -> list[OutboxRow]:
    """The oldest ``limit`` unpublished rows of ``store``'s outbox (``failing``: those whose
    delivery failed at least once)."""
    from idemctl.outbox.table import OutboxTable

    return OutboxTable(store).pending(limit, failing)
