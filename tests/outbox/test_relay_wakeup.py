"""The relay's wake-up, on a real PostgreSQL server and the real broker: an idle relay whose
poll interval is ten minutes publishes a row as soon as it commits (the table's trigger
notifies, the relay listens), listens again after its listening connection was killed
(and looks at once for what was committed meanwhile), and with ``listen=False`` waits for
its poll. Rows are written outside the relay's view of time: each test would wait out the
ten-minute poll, and fail at its 30 s deadline, if the notification were not heard."""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

import pytest

from idemctl.outbox import Outbox
from idemctl.outbox.relay import Relay, RelayOptions, RelaySummary
from idemctl.outbox.table import OutboxTable
from idemctl.outbox.wakeup import Wakeup, channel
from idemctl.stores import open_store
from tests.backends import unique_schema
from tests.outbox.test_outbox import Pg, drop_schema, tag
from tests.polling import wait_until
from tests.servers import KafkaBroker, PostgresServer

NEVER = 600.0
"""A poll interval no test waits out."""


class Running:
    """A relay in a thread of its own; ``rounds`` counts the rounds it has done."""

    def __init__(self, pg: Pg, broker: KafkaBroker, **options: Any) -> None:
        topic = broker.create_topic(f"wake-{tag()}", partitions=1)
        self.rounds = 0
        self.relay = Relay(
            pg.store,
            RelayOptions(broker.bootstrap, topic_template=topic, poll_interval=NEVER, **options),
            on_progress=self._round,
        )
        self.thread = threading.Thread(target=self.relay.run, name="relay", daemon=True)

    def _round(self, _summary: RelaySummary) -> None:
        self.rounds += 1

    def __enter__(self) -> Running:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.relay.stop()
        self.thread.join(10)
        assert not self.thread.is_alive(), "the relay did not stop"

    def idle(self, rounds: int = 2) -> None:
        """Wait until it has done ``rounds`` rounds (the first, and the look it takes once
        it listens: its LISTEN comes before that look): from then on it waits in its poll
        interval, and a notification sent meanwhile is queued for it."""
        wait_until(
            lambda: self.rounds >= rounds,
            f"the relay does {rounds} round(s)",
            timeout=30,
            interval=0.02,
            detail=lambda: f"it did {self.rounds}",
        )


def write(pg: Pg, n: int = 1) -> list[uuid.UUID]:
    with pg.store.connection() as conn, conn.transaction():  # type: ignore[attr-defined]
        outbox = Outbox(conn, pg.table)
        return [outbox.add("acct", "A", "Opened", {"n": i}) for i in range(n)]


def published_within(pg: Pg, ids: list[uuid.UUID], seconds: float) -> bool:
    """Whether every row of ``ids`` is marked published within ``seconds`` (polled)."""

    def published() -> bool:
        rows = pg.rows()
        return all(rows[i]["published_at"] is not None for i in ids)

    try:
        wait_until(published, f"{len(ids)} row(s) published", timeout=seconds)
    except AssertionError:
        return False
    return True


def listeners(pg: Pg) -> list[int]:
    """The backends listening on the table's channel (their last statement a LISTEN)."""
    listen = f'LISTEN "{channel(pg.schema, "outbox")}"'
    found = pg.admin.execute("SELECT pid FROM pg_stat_activity WHERE query = %s", (listen,))
    return [r[0] for r in found.fetchall()]


def test_the_channel_is_the_one_the_trigger_notifies(pg: Pg) -> None:
    with pg.server.connect() as listener:
        listener.execute(f'LISTEN "{channel(pg.schema, "outbox")}"')
        write(pg, 3)
        heard = list(listener.notifies(timeout=10, stop_after=1))
        assert len(heard) == 1 and heard[0].payload == ""
        # one statement, one notification: nothing else is queued
        assert list(listener.notifies(timeout=0.5)) == []


def test_a_prefixed_store_is_heard_on_its_own_channel(postgres_server: PostgresServer) -> None:
    schema = unique_schema()
    stores = [open_store(postgres_server.url(schema=schema, prefix=p)) for p in ("a_", "b_")]
    try:
        for store in stores:
            store.provision()
        channels = [Wakeup(store).channel for store in stores]  # type: ignore[arg-type]
        assert len(set(channels)) == 2
        with postgres_server.connect() as listener:
            for name in channels:
                listener.execute(f'LISTEN "{name}"')
            with stores[1].connection() as conn, conn.transaction():  # type: ignore[attr-defined]
                Outbox(conn, stores[1].names.outbox_table).add("acct", "A", "Opened", {})  # type: ignore[attr-defined]
            heard = list(listener.notifies(timeout=10, stop_after=1))
            assert [n.channel for n in heard] == [channels[1]]
    finally:
        for store in stores:
            store.close()
        drop_schema(postgres_server, schema)


def test_an_idle_relay_publishes_a_row_as_soon_as_it_commits(
    pg: Pg, kafka_broker: KafkaBroker
) -> None:
    with Running(pg, kafka_broker) as running:
        running.idle()
        before = running.rounds
        ids = write(pg, 2)
        assert published_within(pg, ids, 30), "the relay slept through the notification"
        assert running.relay.summary.published == 2
        assert running.rounds - before <= 3  # woken, not polling in a loop
        more = write(pg)
        assert published_within(pg, more, 30)


def test_a_relay_whose_listening_connection_died_listens_again_and_looks_at_once(
    pg: Pg, kafka_broker: KafkaBroker
) -> None:
    with Running(pg, kafka_broker) as running:
        running.idle()
        pids = wait_until(lambda: listeners(pg), "the relay's LISTEN shows", timeout=30)
        assert len(pids) == 1, pids
        pg.admin.execute("SELECT pg_terminate_backend(%s)", (pids[0],))
        ids = write(pg)  # committed while nobody listens: its notification is lost
        assert published_within(pg, ids, 30), "the relay never listened or looked again"
        again = listeners(pg)
        assert len(again) == 1 and again != pids
        later = write(pg)
        assert published_within(pg, later, 30)


def test_without_listen_a_relay_opens_no_listening_connection(
    pg: Pg, kafka_broker: KafkaBroker
) -> None:
    with Running(pg, kafka_broker, listen=False) as running:
        running.idle(rounds=1)
        ids = write(pg)
        assert listeners(pg) == []
        assert not published_within(pg, ids, 1.0)  # it waits for its poll, ten minutes on
        assert running.rounds == 1


def test_a_schema_without_the_trigger_is_named_and_polled(
    postgres_server: PostgresServer, kafka_broker: KafkaBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """A schema from before migration 5 (idemctl upgraded, `idemctl init` not run yet): the
    relay says so once, and publishes at its poll."""
    schema = unique_schema()
    store = open_store(postgres_server.url(schema=schema))
    try:
        store.provision(upto=4)  # type: ignore[call-arg]
        old = Pg(postgres_server, schema, postgres_server.url(schema=schema), store, None)
        assert not OutboxTable(store).notifies()
        topic = kafka_broker.create_topic(f"wake-{tag()}", partitions=1)
        ids = write(old)
        relay = Relay(
            store,
            RelayOptions(kafka_broker.bootstrap, topic_template=topic, exit_when_idle=0.5),
        )
        with caplog.at_level(logging.WARNING, logger="idemctl.outbox"):
            assert relay.run().published == len(ids)
        warned = [r.getMessage() for r in caplog.records if "no trigger" in r.getMessage()]
        assert len(warned) == 1 and "run 'idemctl init'" in warned[0], warned
        store.provision()
        assert OutboxTable(store).notifies()
    finally:
        store.close()
        drop_schema(postgres_server, schema)
