"""The consumer groups and topics a Kafka cluster lists: what an operator picks an audit's
group and topic from (``idemctl.operate.brokers``, the console's audit form)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from idemctl.errors import ConfigError, KafkaUnavailable

if TYPE_CHECKING:
    from collections.abc import Mapping

kafka_log = logging.getLogger("idemctl.audit.names")


@dataclass(frozen=True)
class Known:
    """The consumer groups and topics a cluster lists (Kafka's own ``__`` topics left out)."""

    groups: list[str] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)


def known(brokers: str, kafka_config: Mapping[str, str], timeout: float = 3.0) -> Known:
    """The groups and topics the cluster at ``brokers`` lists, within ``timeout`` seconds
    each; KafkaUnavailable when it does not answer in time, ConfigError for bad settings."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        admin = AdminClient({"bootstrap.servers": brokers, **kafka_config}, logger=kafka_log)
    except (KafkaException, ValueError) as exc:
        raise ConfigError(f"Kafka client settings: {exc}") from None
    try:
        topics = admin.list_topics(timeout=timeout).topics
        listed = admin.list_consumer_groups(request_timeout=timeout).result(timeout=timeout)
    except Exception as exc:  # KafkaException, a future's timeout: the cluster did not answer
        raise KafkaUnavailable(f"the brokers at {brokers} did not answer: {exc}") from None
    return Known(
        groups=sorted(g.group_id for g in listed.valid),
        topics=sorted(t for t in topics if not t.startswith("__")),
    )
