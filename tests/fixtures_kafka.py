"""A session-wide Kafka-protocol broker (tansu), started on first use and stopped by PID
at the end of the session. Tests share it through topics and groups of their own.

At the end it is killed (SIGKILL, by PID): it keeps everything in memory, so there is
nothing to flush, and on SIGTERM it waits some 5 s for the clients still connected."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers import KafkaBroker


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    try:
        broker.start()
        yield broker
    finally:
        broker.kill()
