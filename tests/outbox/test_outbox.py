"""The transactional outbox on a real PostgreSQL server (and the real broker where Kafka is
involved): the writer, ctx.outbox in transactional handlers, the table's status, purge and
selection, the relay library, the ``idemctl outbox`` commands, and the upgrade from the
schema without ``seq``/``retry_at``.

Each test has a schema of its own (dropped afterwards) and topics of its own. Topics are
read by assigning every partition from its start (no group join) until the expected messages
came and a second more; "sends nothing" is also checked on the partitions' end offsets.

Tests marked xfail(strict=True) pin bugs found in idemctl; each reason says what is wrong."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import idemctl
from idemctl.errors import ConfigError, NotProvisioned, OutboxError
from idemctl.outbox import Outbox, add, outbox_table
from idemctl.outbox.relay import Relay, RelayOptions
from idemctl.outbox.replay import Replay
from idemctl.outbox.table import BATCH, OutboxTable, Selection
from idemctl.runner import Outcome
from idemctl.stores import open_store
from idemctl.stores.base import Store
from idemctl.stores.postgres.sql import migrations
from tests.backends import unique_schema
from tests.cli.helpers import json_doc, on
from tests.servers import KafkaBroker, PostgresServer, free_port

T0 = datetime(2024, 1, 1, 10, 0, tzinfo=UTC)
"""A fixed moment that created_at / published_at are set around."""


# PostgreSQL ----------------------------------------------------------------------------------


@dataclass
class Pg:
    """A provisioned store in a schema of the test's own, and a plain connection to look."""

    server: PostgresServer
    schema: str
    url: str
    store: Store
    admin: Any  # psycopg.Connection, autocommit

    @property
    def table(self) -> str:
        return outbox_table(self.schema)

    def write(
        self,
        aggregatetype: str,
        aggregateid: str,
        type: str,
        payload: Any,
        headers: dict[str, str] | None = None,
    ) -> uuid.UUID:
        """One row, committed, through the public writer."""
        with self.store.connection() as conn, conn.transaction():  # type: ignore[attr-defined]
            return add(conn, aggregatetype, aggregateid, type, payload, headers, schema=self.schema)

    def write_many(self, n: int, aggregatetype: str, type: str = "Made") -> list[uuid.UUID]:
        """``n`` rows in one transaction, through the writer, in order."""
        with self.store.connection() as conn, conn.transaction():  # type: ignore[attr-defined]
            outbox = Outbox(conn, self.table)
            return [outbox.add(aggregatetype, f"a-{i}", type, {"i": i}) for i in range(n)]

    def rows(self) -> dict[uuid.UUID, dict[str, Any]]:
        cursor = self.admin.execute(
            "SELECT id, aggregatetype, aggregateid, type, payload, headers, created_at, "
            f"published_at, attempts, last_error, seq, retry_at FROM {self.table} ORDER BY seq"
        )
        names = [d.name for d in cursor.description]
        return {r[0]: dict(zip(names, r, strict=True)) for r in cursor.fetchall()}

    def set(self, ids: list[uuid.UUID], **columns: Any) -> None:
        assignments = ", ".join(f"{name} = %({name})s" for name in columns)
        self.admin.execute(
            f"UPDATE {self.table} SET {assignments} WHERE id = ANY(%(ids)s)",
            {**columns, "ids": ids},
        )

    def now(self) -> datetime:
        return self.admin.execute("SELECT clock_timestamp()").fetchone()[0]


def drop_schema(server: PostgresServer, schema: str) -> None:
    with server.connect() as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def pg(postgres_server: PostgresServer) -> Iterator[Pg]:
    schema = unique_schema()
    url = postgres_server.url(schema=schema)
    store = open_store(url)
    store.provision()
    admin = postgres_server.connect()
    try:
        yield Pg(postgres_server, schema, url, store, admin)
    finally:
        store.close()
        admin.close()
        drop_schema(postgres_server, schema)


def tag() -> str:
    return uuid.uuid4().hex[:10]


# Kafka ---------------------------------------------------------------------------------------


def new_topic(broker: KafkaBroker, name: str | None = None) -> str:
    return broker.create_topic(name or f"outbox-t-{tag()}", partitions=3)


def read_topic(broker: KafkaBroker, topic: str, expect: int, timeout: float = 30.0) -> list[Any]:
    """Every message on ``topic``: each partition read from its start, by a consumer of a
    group of its own, until ``expect`` messages came, then for a second more (anything
    beyond ``expect`` shows up in the caller's assertion, not silently). With ``expect=0``
    the partitions' end offsets must be 0 too: nothing was ever written to the topic."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition
    from confluent_kafka import Consumer as KafkaConsumer

    consumer = KafkaConsumer(
        broker.client_config(**{"group.id": f"reader-{tag()}", "enable.auto.commit": False})
    )
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        partitions = sorted(metadata.topics[topic].partitions)
        assert partitions, f"topic {topic} has no partitions"
        if expect == 0:
            # (tansu's end offsets undercount batches, but are above 0 once a batch landed)
            ends = [
                consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in partitions
            ]
            assert ends == [0] * len(partitions), f"{topic} holds messages: ends {ends}"
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        got: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(got) < expect and time.monotonic() < deadline:
            got += [m for m in consumer.consume(num_messages=500, timeout=0.5) if not m.error()]
        quiet = time.monotonic() + 1.0
        while time.monotonic() < quiet:
            got += [m for m in consumer.consume(num_messages=500, timeout=0.2) if not m.error()]
        return got
    finally:
        consumer.close()


def headers_of(message: Any) -> list[tuple[str, str]]:
    return [(k, v.decode()) for k, v in message.headers() or []]


def by_id(messages: list[Any]) -> dict[str, Any]:
    """Messages by their id header (each id once)."""
    found: dict[str, Any] = {}
    for m in messages:
        row_id = dict(headers_of(m))["id"]
        assert row_id not in found, f"id {row_id} sent twice"
        found[row_id] = m
    return found


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def relay_options(broker: KafkaBroker | str, **kw: Any) -> RelayOptions:
    kw.setdefault("poll_interval", 0.1)
    kw.setdefault("exit_when_idle", 0.5)
    kw.setdefault("delivery_timeout", 10.0)
    brokers = broker if isinstance(broker, str) else broker.bootstrap
    return RelayOptions(brokers, **kw)


def dead_brokers() -> str:
    """A broker address on 127.0.0.1 where nothing listens."""
    return f"127.0.0.1:{free_port()}"


# 1. The writer ------------------------------------------------------------------------------------


def test_add_inside_a_transaction_writes_the_row_as_given(pg: Pg) -> None:
    with pg.store.connection() as conn, conn.transaction():  # type: ignore[attr-defined]
        row_id = add(
            conn, "order", 42, "OrderPlaced", {"b": [1, 2], "a": {"é": "ü"}},
            {"traceparent": "00-abc-01", "source": "shop"}, schema=pg.schema,
        )  # fmt: skip
        other = add(conn, "order", uuid.UUID(int=7), "OrderPaid", None, schema=pg.schema)
    assert isinstance(row_id, uuid.UUID) and isinstance(other, uuid.UUID)
    rows = pg.rows()
    assert list(rows) == [row_id, other]  # seq follows the order of writing
    row = rows[row_id]
    assert row["aggregatetype"] == "order"
    assert row["aggregateid"] == "42"
    assert row["type"] == "OrderPlaced"
    assert row["payload"] == {"b": [1, 2], "a": {"é": "ü"}}
    assert row["headers"] == {"traceparent": "00-abc-01", "source": "shop"}
    assert row["published_at"] is None and row["attempts"] == 0 and row["last_error"] is None
    assert row["retry_at"] is None
    assert rows[other]["aggregateid"] == str(uuid.UUID(int=7))
    assert rows[other]["payload"] is None and rows[other]["headers"] == {}


def test_a_rolled_back_transaction_leaves_no_row(pg: Pg) -> None:
    class Undo(Exception):
        pass

    written: list[uuid.UUID] = []
    with pg.store.connection() as conn:
        try:
            with conn.transaction():
                written.append(add(conn, "order", "o-1", "OrderPlaced", {"n": 1}, schema=pg.schema))
                raise Undo
        except Undo:
            pass
        # and psycopg's own way out: Rollback leaves the block without an exception
        with conn.transaction() as tx:
            written.append(add(conn, "order", "o-2", "OrderPlaced", {"n": 2}, schema=pg.schema))
            raise psycopg.Rollback(tx)
    assert len(written) == 2
    assert pg.rows() == {}


def test_an_autocommit_connection_outside_a_transaction_is_refused(pg: Pg) -> None:
    with pg.store.connection() as conn:
        assert conn.autocommit
        with pytest.raises(OutboxError, match="inside a transaction"):
            add(conn, "order", "o-1", "OrderPlaced", {"n": 1}, schema=pg.schema)
        # the connection is still usable, and nothing was written by it
        assert conn.execute("SELECT 1").fetchone() == (1,)
    with pg.server.connect(autocommit=True) as plain, pytest.raises(OutboxError):
        add(plain, "order", "o-1", "OrderPlaced", {"n": 1}, schema=pg.schema)
    assert pg.rows() == {}


def test_a_connection_with_autocommit_off_writes_on_commit(pg: Pg) -> None:
    conn = pg.server.connect(autocommit=False)
    try:
        row_id = add(conn, "invoice", "inv-9", "InvoiceSent", {"total": 12}, schema=pg.schema)
        assert pg.rows() == {}  # not committed yet: invisible to others
        conn.commit()
        rolled_back = add(conn, "invoice", "inv-10", "InvoiceSent", {}, schema=pg.schema)
        conn.rollback()
    finally:
        conn.close()
    rows = pg.rows()
    assert list(rows) == [row_id]
    assert rolled_back not in rows
    assert rows[row_id]["aggregateid"] == "inv-9" and rows[row_id]["payload"] == {"total": 12}


@pytest.mark.parametrize(
    ("args", "headers", "message"),
    [
        (("", "a-1", "Made", {}), None, "aggregatetype must not be empty"),
        (("order", "", "Made", {}), None, "aggregateid must not be empty"),
        (("order", "a-1", "", {}), None, "type must not be empty"),
        ((None, "a-1", "Made", {}), None, "aggregatetype must be text"),
        (("order", True, "Made", {}), None, "aggregateid must be text"),
        (("order", "a-1", 3.5, {}), None, "type must be text"),
        (("order", "a-1", "Made", {}), {"id": "mine"}, "'id' is set by the relay"),
        (("order", "a-1", "Made", {}), {"type": "mine"}, "'type' is set by the relay"),
        (("order", "a-1", "Made", {}), {"n": 1}, "headers map text to text"),
        (("order", "a-1", "Made", {1, 2}), None, "payload is not JSON"),
        (("order", "a-1", "Made", {"x": float("nan")}), None, "payload is not JSON"),
        (("order", "a-1", "Made", {"x": object()}), None, "payload is not JSON"),
    ],
    ids=[
        "empty-aggregatetype", "empty-aggregateid", "empty-type", "none-aggregatetype",
        "bool-aggregateid", "float-type", "header-id", "header-type", "header-not-text",
        "set-payload", "nan-payload", "object-payload",
    ],
)  # fmt: skip
def test_invalid_rows_raise_outbox_error_and_write_nothing(
    pg: Pg, args: tuple[Any, ...], headers: dict[str, Any] | None, message: str
) -> None:
    with pg.store.connection() as conn, conn.transaction():  # type: ignore[attr-defined]
        with pytest.raises(OutboxError, match=message):
            add(conn, *args, headers, schema=pg.schema)
        # the transaction is intact: a valid row after the refused one commits
        good = add(conn, "order", "a-1", "Made", {"ok": True}, schema=pg.schema)
    assert list(pg.rows()) == [good]


@pytest.mark.parametrize(
    ("payload", "headers"),
    [({"note": "nul\x00here"}, None), ({}, {"trace": "nul\x00here"})],
    ids=["payload", "header"],
)
def test_a_row_postgresql_cannot_hold_raises_outbox_error(
    pg: Pg, payload: Any, headers: dict[str, str] | None
) -> None:
    conn = pg.server.connect(autocommit=False)
    try:
        with pytest.raises(OutboxError):
            add(conn, "order", "a-1", "Made", payload, headers, schema=pg.schema)
        # refused before the INSERT: the caller's transaction goes on
        good = add(conn, "order", "a-2", "Made", {"ok": True}, schema=pg.schema)
        conn.commit()
    finally:
        conn.close()
    assert list(pg.rows()) == [good]


def test_schema_and_prefix_pick_the_table_of_the_store(postgres_server: PostgresServer) -> None:
    schema = unique_schema()
    url = postgres_server.url(schema=schema, prefix="app_")
    try:
        with open_store(url) as store:
            store.provision()
            assert store.outbox_table == f'"{schema}"."app_outbox"'  # type: ignore[attr-defined]
            with store.connection() as conn, conn.transaction():  # type: ignore[attr-defined]
                row_id = add(conn, "user", "u-1", "UserCreated", {"n": 1},
                             schema=schema, prefix="app_")  # fmt: skip
            with store.connection() as conn:  # type: ignore[attr-defined]
                found = conn.execute(
                    f'SELECT id, aggregatetype FROM "{schema}"."app_outbox"'
                ).fetchall()
                unprefixed = conn.execute("SELECT to_regclass(%s)", (f'"{schema}".outbox',))
                assert unprefixed.fetchone() == (None,)
            assert found == [(row_id, "user")]
            # the library reads the same table
            assert OutboxTable(store).count(Selection(aggregatetype="user")) == 1
    finally:
        drop_schema(postgres_server, schema)


# 2. ctx.outbox ------------------------------------------------------------------------------------


def effects_table(pg: Pg) -> str:
    name = f'"{pg.schema}".effects'
    pg.admin.execute(f"CREATE TABLE {name} (key text PRIMARY KEY, cents integer NOT NULL)")
    return name


def test_ctx_outbox_rows_commit_with_the_key_and_the_effect(pg: Pg) -> None:
    effects = effects_table(pg)
    made: list[uuid.UUID] = []
    calls = 0

    def debit(ctx: idemctl.Context) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        ctx.connection.execute(f"INSERT INTO {effects} VALUES (%s, %s)", (ctx.key, 500))
        made.append(ctx.outbox.add("account", "acc-1", "AccountDebited", {"cents": 500}))
        made.append(ctx.outbox.add("account", "acc-1", "ReceiptIssued", {"n": 1}, {"trace": "t-1"}))
        return {"debited": 500}

    first = idemctl.run(pg.store, "debit-1", debit, transactional=True)
    assert first.outcome is Outcome.EXECUTED, first.error
    assert first.result == {"debited": 500}
    assert pg.admin.execute(f"SELECT key, cents FROM {effects}").fetchall() == [("debit-1", 500)]
    rows = pg.rows()
    assert list(rows) == made
    assert [(r["type"], r["payload"], r["headers"]) for r in rows.values()] == [
        ("AccountDebited", {"cents": 500}, {}),
        ("ReceiptIssued", {"n": 1}, {"trace": "t-1"}),
    ]
    record = pg.store.get("debit-1")
    assert record is not None and record.status.value == "completed"

    again = idemctl.run(pg.store, "debit-1", debit, transactional=True)
    assert again.outcome is Outcome.REPLAYED
    assert again.result == {"debited": 500}
    assert calls == 1
    assert list(pg.rows()) == made  # no rows added by the replay
    assert pg.admin.execute(f"SELECT count(*) FROM {effects}").fetchone() == (1,)


def test_a_failing_handler_leaves_neither_effect_nor_outbox_rows(pg: Pg) -> None:
    effects = effects_table(pg)

    def debit_then_fail(ctx: idemctl.Context) -> None:
        ctx.connection.execute(f"INSERT INTO {effects} VALUES (%s, %s)", (ctx.key, 500))
        ctx.outbox.add("account", "acc-1", "AccountDebited", {"cents": 500})
        ctx.outbox.add("account", "acc-1", "ReceiptIssued", {"n": 1})
        raise RuntimeError("card declined")

    result = idemctl.run(pg.store, "debit-2", debit_then_fail, transactional=True)
    assert result.outcome is Outcome.ERROR
    assert isinstance(result.error, RuntimeError) and str(result.error) == "card declined"
    assert result.retriable
    assert pg.admin.execute(f"SELECT count(*) FROM {effects}").fetchone() == (0,)
    assert pg.rows() == {}
    record = pg.store.get("debit-2")
    assert record is not None and record.status.value == "failed"
    assert "card declined" in (record.error or "")

    # the retry that succeeds leaves exactly its own effect and rows: nothing doubled
    def debit(ctx: idemctl.Context) -> str:
        ctx.connection.execute(f"INSERT INTO {effects} VALUES (%s, %s)", (ctx.key, 500))
        return str(ctx.outbox.add("account", "acc-1", "AccountDebited", {"cents": 500}))

    retry = idemctl.run(pg.store, "debit-2", debit, transactional=True)
    assert retry.outcome is Outcome.EXECUTED, retry.error
    assert retry.attempt == 2
    assert pg.admin.execute(f"SELECT count(*) FROM {effects}").fetchone() == (1,)
    assert [str(i) for i in pg.rows()] == [retry.result]


def test_ctx_outbox_outside_transactional_mode_raises_outbox_error(pg: Pg) -> None:
    def announce(ctx: idemctl.Context) -> None:
        ctx.outbox.add("account", "acc-1", "AccountDebited", {"cents": 500})

    result = idemctl.run(pg.store, "plain-1", announce)
    assert result.outcome is Outcome.ERROR
    assert isinstance(result.error, OutboxError)
    assert "transactional" in str(result.error)
    assert not result.retriable  # it would fail the same way on every retry
    assert pg.rows() == {}


# 3. OutboxTable: status, purge, selection ---------------------------------------------------------


def test_status_counts_per_aggregate_type(pg: Pg) -> None:
    orders = pg.write_many(5, "order")
    users = pg.write_many(3, "user")
    zetas = pg.write_many(2, "zeta")
    # order: 2 published, 1 failing twice, 2 unpublished never tried
    pg.set(orders[:2], published_at=T0 + timedelta(hours=1))
    pg.set(orders[2:3], attempts=2, last_error="broker down")
    pg.set(orders[2:], created_at=T0)
    pg.set(orders[3:4], created_at=T0 - timedelta(minutes=30))
    # user: all published, one of them after failing once (its error is history now)
    pg.set(users, published_at=T0 + timedelta(hours=2))
    pg.set(users[:1], published_at=T0 + timedelta(hours=3), attempts=1, last_error="old error")
    # zeta: both failing; the later one's error is the last error
    pg.set(zetas[:1], attempts=1, last_error="first")
    pg.set(zetas[1:], attempts=3, last_error="second")

    found = OutboxTable(pg.store).status()
    by_type = {t.aggregatetype: t for t in found.types}
    assert [t.aggregatetype for t in found.types] == ["order", "user", "zeta"]
    order, user, zeta = by_type["order"], by_type["user"], by_type["zeta"]
    assert (order.unpublished, order.failing, order.published) == (3, 1, 2)
    assert order.oldest_unpublished == T0 - timedelta(minutes=30)
    assert order.last_published == T0 + timedelta(hours=1)
    assert order.last_error == "broker down"
    assert (user.unpublished, user.failing, user.published) == (0, 0, 3)
    assert user.oldest_unpublished is None
    assert user.last_published == T0 + timedelta(hours=3)
    assert user.last_error is None
    assert (zeta.unpublished, zeta.failing, zeta.published) == (2, 2, 0)
    assert zeta.last_error == "second"
    total = found.total
    assert (total.unpublished, total.failing, total.published) == (5, 3, 5)
    assert total.oldest_unpublished == T0 - timedelta(minutes=30)
    assert total.last_published == T0 + timedelta(hours=3)
    assert abs((found.now - pg.now()).total_seconds()) < 5


def test_status_of_an_empty_outbox(pg: Pg) -> None:
    found = OutboxTable(pg.store).status()
    assert found.types == []
    assert (found.total.unpublished, found.total.failing, found.total.published) == (0, 0, 0)


def test_purge_deletes_only_published_rows_old_enough(pg: Pg) -> None:
    old = pg.write_many(4, "order")
    recent = pg.write_many(3, "order")
    unpublished = pg.write_many(3, "order")
    now = pg.now()
    pg.set(old, published_at=now - timedelta(hours=2))
    pg.set(recent, published_at=now - timedelta(minutes=10))
    # unpublished rows written long ago are never purged, however old
    pg.set(unpublished, created_at=now - timedelta(days=30))
    table = OutboxTable(pg.store)

    assert table.purge(3600, dry_run=True) == 4
    assert len(pg.rows()) == 10  # the dry run deleted nothing

    sizes: list[int] = []
    assert table.purge(3600, progress=sizes.append) == 4
    assert sizes == [4]
    assert set(pg.rows()) == set(recent) | set(unpublished)

    assert table.purge(0) == 3
    assert set(pg.rows()) == set(unpublished)
    assert table.purge(0) == 0
    assert set(pg.rows()) == set(unpublished)


def test_purge_works_in_batches_and_reports_each(pg: Pg) -> None:
    n = 2 * BATCH + 137
    published = pg.write_many(n, "bulk")
    kept = pg.write_many(5, "bulk")
    pg.set(published, published_at=pg.now() - timedelta(days=8))
    table = OutboxTable(pg.store)
    assert table.purge(7 * 86400, dry_run=True) == n
    sizes: list[int] = []
    assert table.purge(7 * 86400, progress=sizes.append) == n
    assert sum(sizes) == n
    assert sizes == [BATCH, BATCH, 137]
    assert set(pg.rows()) == set(kept)


def test_selection_windows_since_inclusive_until_exclusive(pg: Pg) -> None:
    ids = pg.write_many(5, "order")
    users = pg.write_many(2, "user")
    for i, row_id in enumerate(ids):  # 10:00, 11:00, ... 14:00
        pg.set([row_id], created_at=T0 + timedelta(hours=i))
    table = OutboxTable(pg.store)

    def chosen(selection: Selection, page: int = BATCH) -> list[uuid.UUID]:
        return [r.id for p in table.select(selection, page) for r in p]

    window = Selection(since=T0 + timedelta(hours=1), until=T0 + timedelta(hours=3))
    assert table.count(window) == 2
    assert chosen(window) == ids[1:3]
    assert chosen(Selection(since=T0 + timedelta(hours=3), aggregatetype="order")) == ids[3:]
    assert chosen(Selection(since=T0 + timedelta(hours=3))) == [*ids[3:], *users]
    assert chosen(Selection(until=T0 + timedelta(hours=1))) == ids[:1]
    half_hour = Selection(since=T0 + timedelta(minutes=30), until=T0 + timedelta(minutes=59))
    assert table.count(half_hour) == 0 and chosen(half_hour) == []
    # conditions combine
    assert table.count(Selection(aggregatetype="user")) == 2
    assert table.count(Selection(aggregatetype="order", aggregateid="a-2")) == 1
    assert chosen(Selection(ids=(ids[4], ids[0]))) == [ids[0], ids[4]]  # in writing order
    assert table.count(Selection(ids=(ids[0],), aggregatetype="user")) == 0
    # pages follow seq, none lost or repeated
    pages = [[r.id for r in p] for p in table.select(Selection(aggregatetype="order"), 2)]
    assert pages == [ids[0:2], ids[2:4], ids[4:5]]
    rows = [r for p in table.select(Selection(ids=(ids[1],))) for r in p]
    assert rows[0].created_at == T0 + timedelta(hours=1)
    assert rows[0].payload == {"i": 1} and rows[0].aggregateid == "a-1"


def test_the_outbox_needs_a_postgresql_store(tmp_path: Any) -> None:
    with open_store(f"sqlite:///{tmp_path}/s.db") as store:
        with pytest.raises(ConfigError, match="PostgreSQL"):
            OutboxTable(store)
        with pytest.raises(ConfigError, match="PostgreSQL"):
            Relay(store, RelayOptions("127.0.0.1:9"))


# 4. The relay -------------------------------------------------------------------------------------


def test_relay_publishes_every_row_once_and_marks_it(pg: Pg, kafka_broker: KafkaBroker) -> None:
    kind = f"order{tag()}"
    topic = new_topic(kafka_broker, f"outbox.event.{kind}")
    written = {
        pg.write(kind, f"o-{i}", "OrderPlaced", {"z": i, "a": "é"}, {"trace": f"tr-{i}"}): i
        for i in range(7)
    }
    tombstone = pg.write(kind, "o-gone", "OrderDeleted", None)
    summary = Relay(pg.store, relay_options(kafka_broker, batch_size=3)).run()
    assert summary.published == 8 and summary.failed == 0
    assert summary.batches == 3  # 3 + 3 + 2

    messages = by_id(read_topic(kafka_broker, topic, 8))
    assert set(messages) == {str(i) for i in [*written, tombstone]}
    for row_id, i in written.items():
        m = messages[str(row_id)]
        assert m.key() == f"o-{i}".encode()
        assert m.value() == canonical({"z": i, "a": "é"})
        assert m.value() == f'{{"a":"é","z":{i}}}'.encode()
        assert headers_of(m) == [("id", str(row_id)), ("type", "OrderPlaced"), ("trace", f"tr-{i}")]
    gone = messages[str(tombstone)]
    assert gone.key() == b"o-gone" and gone.value() is None
    assert headers_of(gone) == [("id", str(tombstone)), ("type", "OrderDeleted")]
    rows = pg.rows()
    assert all(r["published_at"] is not None and r["attempts"] == 0 for r in rows.values())
    assert all(r["retry_at"] is None and r["last_error"] is None for r in rows.values())

    # a second relay finds nothing to do and sends nothing more
    again = Relay(pg.store, relay_options(kafka_broker)).run()
    assert (again.published, again.failed, again.batches) == (0, 0, 0)
    assert len(read_topic(kafka_broker, topic, 8)) == 8


def test_relay_keeps_each_aggregates_order(pg: Pg, kafka_broker: KafkaBroker) -> None:
    kind = f"acct{tag()}"
    topic = new_topic(kafka_broker, f"outbox.event.{kind}")
    ids = [pg.write(kind, f"acc-{i % 2}", f"Step{i}", {"i": i}) for i in range(10)]
    summary = Relay(pg.store, relay_options(kafka_broker, batch_size=4)).run()
    assert summary.published == 10
    messages = read_topic(kafka_broker, topic, 10)
    for account in ("acc-0", "acc-1"):
        mine = [m for m in messages if m.key() == account.encode()]
        assert len({m.partition() for m in mine}) == 1
        mine.sort(key=lambda m: m.offset())
        expected = [str(i) for n, i in enumerate(ids) if f"acc-{n % 2}" == account]
        assert [dict(headers_of(m))["id"] for m in mine] == expected


def test_relay_topic_template_routes_rows(pg: Pg, kafka_broker: KafkaBroker) -> None:
    kind = f"cart{tag()}"
    added = new_topic(kafka_broker, f"{kind}.ItemAdded")
    removed = new_topic(kafka_broker, f"{kind}.ItemRemoved")
    first = pg.write(kind, "c-1", "ItemAdded", {"sku": "x"})
    second = pg.write(kind, "c-1", "ItemRemoved", {"sku": "x"})
    third = pg.write(kind, "c-2", "ItemAdded", {"sku": "y"})
    options = relay_options(kafka_broker, topic_template="{aggregatetype}.{type}")
    assert Relay(pg.store, options).run().published == 3
    assert set(by_id(read_topic(kafka_broker, added, 2))) == {str(first), str(third)}
    assert set(by_id(read_topic(kafka_broker, removed, 1))) == {str(second)}


@pytest.mark.parametrize(
    "template", ["outbox.{topic}", "{0}", "x.{}", "{aggregatetype.upper}", "bad.{aggregatetype"]
)
def test_an_unusable_topic_template_is_a_config_error(template: str) -> None:
    with pytest.raises(ConfigError, match="topic template"):
        RelayOptions("127.0.0.1:9092", topic_template=template)


def test_an_empty_topic_template_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="empty"):
        RelayOptions("127.0.0.1:9092", topic_template="  ")


def test_a_failed_delivery_is_counted_and_held_back(pg: Pg) -> None:
    ids = [pg.write("payment", f"p-{i}", "PaymentTaken", {"i": i}) for i in range(3)]
    before = pg.now()
    options = relay_options(dead_brokers(), delivery_timeout=1.0, backoff=60.0)
    summary = Relay(pg.store, options).run()
    after = pg.now()
    assert summary.published == 0
    assert summary.failed == 3  # one attempt each: the back-off holds them past the idle exit
    assert summary.batches == 1
    assert summary.last_error
    rows = pg.rows()
    for row_id in ids:
        row = rows[row_id]
        assert row["published_at"] is None
        assert row["attempts"] == 1
        assert row["last_error"]
        assert row["retry_at"] > after
        # about 60 s after the attempt began (now() of the relay's transaction)
        assert before + timedelta(seconds=55) < row["retry_at"] < after + timedelta(seconds=61)
    found = OutboxTable(pg.store).status()
    (payment,) = found.types
    assert (payment.unpublished, payment.failing, payment.published) == (3, 3, 0)
    assert payment.last_error == rows[ids[-1]]["last_error"]

    # held back: another relay round takes nothing until retry_at
    assert Relay(pg.store, options).relay_once() == 0
    assert all(r["attempts"] == 1 for r in pg.rows().values())


def test_the_back_off_starts_when_the_delivery_failed(pg: Pg) -> None:
    row_id = pg.write("payment", "p-1", "PaymentTaken", {"i": 1})
    options = relay_options(dead_brokers(), delivery_timeout=2.0, backoff=1.0)
    relay = Relay(pg.store, options)
    assert relay.relay_once() == 1
    failed_at = pg.now()
    row = pg.rows()[row_id]
    assert row["attempts"] == 1 and row["published_at"] is None
    # "backoff seconds after its first failure": not due before then
    assert row["retry_at"] > failed_at


# 5. The CLI ---------------------------------------------------------------------------------------


def test_cli_status_table_and_json(pg: Pg) -> None:
    orders = pg.write_many(3, "order")
    pg.write_many(2, "user")
    pg.set(orders[:1], published_at=T0)
    pg.set(orders[1:2], attempts=1, last_error="no leader")
    pg.set(orders[1:], created_at=pg.now() - timedelta(hours=1))

    text = on(pg.url, "outbox", "status")
    assert text.exit_code == 0, text.stderr
    lines = {
        cells[0]: cells[1:]
        for line in text.stdout.splitlines()
        if (cells := [c.strip() for c in line.strip("│┃ ").split("│") if c.strip()])
        and len(cells) == 7
    }
    assert lines["order"][0] == "2"  # unpublished
    assert lines["order"][2:4] == ["1", "1"]  # failing, published
    assert lines["order"][5] == "no leader"
    assert lines["user"][0] == "2" and lines["user"][2:4] == ["0", "0"]
    assert lines["all"][0] == "4" and lines["all"][2:4] == ["1", "1"]

    result = on(pg.url, "outbox", "status", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json_doc(result, "outbox-status.schema.json")
    assert doc["store"] == pg.url
    at = datetime.fromisoformat(doc["at"])
    assert abs((at - pg.now()).total_seconds()) < 5
    order, user = doc["types"]
    assert order["aggregatetype"] == "order" and user["aggregatetype"] == "user"
    assert (order["unpublished"], order["failing"], order["published"]) == (2, 1, 1)
    oldest = datetime.fromisoformat(order["oldest_unpublished_at"])
    assert oldest == pg.rows()[orders[1]]["created_at"]
    assert order["oldest_unpublished_age_seconds"] == pytest.approx((at - oldest).total_seconds())
    assert 3500 < order["oldest_unpublished_age_seconds"] < 3700
    assert datetime.fromisoformat(order["last_published_at"]) == T0
    assert order["last_error"] == "no leader"
    assert (user["unpublished"], user["failing"], user["published"]) == (2, 0, 0)
    assert user["last_published_at"] is None and user["last_error"] is None
    total = doc["total"]
    assert total["aggregatetype"] == "*"
    assert (total["unpublished"], total["failing"], total["published"]) == (4, 1, 1)
    assert total["oldest_unpublished_at"] == order["oldest_unpublished_at"]


def test_status_total_carries_the_newest_error(pg: Pg) -> None:
    orders = pg.write_many(1, "order")
    users = pg.write_many(1, "user")
    pg.set(orders, attempts=1, last_error="older error")
    pg.set(users, attempts=1, last_error="newest error")
    found = OutboxTable(pg.store).status()
    assert [t.last_error for t in found.types] == ["older error", "newest error"]
    assert found.total.failing == 2
    assert found.total.last_error == "newest error"


def test_cli_status_of_an_empty_outbox(pg: Pg) -> None:
    result = on(pg.url, "outbox", "status", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json_doc(result, "outbox-status.schema.json")
    assert doc["types"] == []
    assert (doc["total"]["unpublished"], doc["total"]["published"]) == (0, 0)
    text = on(pg.url, "outbox", "status")
    assert text.exit_code == 0, text.stderr


def test_cli_tables_show_bracketed_fields_as_they_are(pg: Pg) -> None:
    row_id = pg.write("shop[red]", "id[b]x", "Placed[bold]", {})
    status = on(pg.url, "outbox", "status")
    assert status.exit_code == 0, status.stderr
    dry = on(pg.url, "outbox", "replay", "--aggregate-type", "shop[red]", "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    assert str(row_id) in dry.stdout  # the row is there, its fields as they are:
    assert "shop[red]" in status.stdout
    for text in ("id[b]x", "Placed[bold]", "outbox.event.shop[red]"):
        assert text in dry.stdout


def test_cli_tables_survive_a_closing_tag_in_a_field(pg: Pg) -> None:
    pg.write("acct[/]", "a-1", "Made", {})
    status = on(pg.url, "outbox", "status")
    assert status.exit_code == 0, status.stderr
    assert "acct[/]" in status.stdout
    dry = on(pg.url, "outbox", "replay", "--aggregate-type", "acct[/]", "--dry-run")
    assert dry.exit_code == 0, dry.stderr


def test_cli_purge(pg: Pg) -> None:
    published = pg.write_many(3, "order")
    unpublished = pg.write_many(2, "order")
    pg.set(published, published_at=pg.now() - timedelta(minutes=5))

    dry = on(pg.url, "outbox", "purge", "--older-than", "0s", "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    assert "3 published row(s) would be purged" in dry.stderr
    assert len(pg.rows()) == 5

    dry_json = on(pg.url, "outbox", "purge", "--older-than", "0s", "--dry-run", "--json")
    assert dry_json.exit_code == 0, dry_json.stderr
    doc = json_doc(dry_json, "action.schema.json")
    assert (doc["action"], doc["store"], doc["dry_run"], doc["count"]) == (
        "outbox purge", pg.url, True, 3,
    )  # fmt: skip
    assert len(pg.rows()) == 5

    too_young = on(pg.url, "outbox", "purge", "--older-than", "1h", "--yes")
    assert too_young.exit_code == 0, too_young.stderr
    assert "purged 0 published outbox row(s)" in too_young.stdout
    assert len(pg.rows()) == 5

    declined = on(pg.url, "outbox", "purge", "--older-than", "0s", input="n\n")
    assert declined.exit_code == 6, declined.stdout + declined.stderr
    assert len(pg.rows()) == 5

    done = on(pg.url, "outbox", "purge", "--older-than", "0s", "--yes", "--json")
    assert done.exit_code == 0, done.stderr
    doc = json_doc(done, "action.schema.json")
    assert (doc["dry_run"], doc["count"]) == (False, 3)
    assert set(pg.rows()) == set(unpublished)


def test_cli_replay_dry_run_lists_rows_and_sends_nothing(pg: Pg, kafka_broker: KafkaBroker) -> None:
    target = new_topic(kafka_broker)
    kind = f"order{tag()}"
    chosen = pg.write_many(3, kind)
    other = pg.write_many(2, "user")
    pg.set(chosen[:1], published_at=T0)
    before = pg.rows()
    result = on(
        pg.url, "outbox", "replay", "--dry-run", "--aggregate-type", kind, "--to-topic", target,
        "--brokers", kafka_broker.bootstrap,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    for row_id in chosen:
        assert str(row_id) in result.stdout
    for row_id in other:
        assert str(row_id) not in result.stdout
    assert "dry run: 3 row(s) would be published again" in result.stderr

    as_json = on(
        pg.url, "outbox", "replay", "--dry-run", "--json", "--aggregate-type", kind,
        "--brokers", kafka_broker.bootstrap,
    )  # fmt: skip
    assert as_json.exit_code == 0, as_json.stderr
    listed = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [d["id"] for d in listed] == [str(i) for i in chosen]
    assert {d["topic"] for d in listed} == {f"outbox.event.{kind}"}
    assert listed[0]["published_at"] is not None and listed[1]["published_at"] is None

    assert read_topic(kafka_broker, target, 0) == []  # nothing sent
    assert pg.rows() == before  # nothing marked


def test_cli_replay_a_time_window_to_a_topic(pg: Pg, kafka_broker: KafkaBroker) -> None:
    target = new_topic(kafka_broker)
    ids = pg.write_many(5, "order")
    for i, row_id in enumerate(ids):  # 10:00 ... 14:00 UTC
        pg.set([row_id], created_at=T0 + timedelta(hours=i))
    pg.set(ids[1:2], published_at=T0 + timedelta(hours=5))
    before = pg.rows()
    result = on(
        pg.url, "outbox", "replay", "--since", "2024-01-01T11:00:00Z",
        "--until", "2024-01-01T13:00:00", "--to-topic", target, "--yes", "--json",
        "--brokers", kafka_broker.bootstrap, "--delivery-timeout", "20s",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {
        "store": pg.url, "store_source": "--store", "selected": 2, "sent": 2,
        "marked_published": 0, "failed": [],
    }  # fmt: skip
    messages = by_id(read_topic(kafka_broker, target, 2))
    assert set(messages) == {str(ids[1]), str(ids[2])}
    for i in (1, 2):
        m = messages[str(ids[i])]
        assert m.key() == f"a-{i}".encode()
        assert m.value() == canonical({"i": i})
        assert headers_of(m) == [("id", str(ids[i])), ("type", "Made")]
    # to another topic: nothing is marked published
    assert pg.rows() == before


def test_cli_replay_times_with_zones_and_durations_ago(pg: Pg) -> None:
    old = pg.write_many(3, "order")
    for i, row_id in enumerate(old):  # 10:00, 11:00, 12:00 UTC
        pg.set([row_id], created_at=T0 + timedelta(hours=i))
    fresh = pg.write("order", "o-new", "Made", {})

    def listed(*args: str) -> list[str]:
        result = on(pg.url, "outbox", "replay", "--dry-run", "--json", *args)
        assert result.exit_code == 0, result.stderr
        return [json.loads(line)["id"] for line in result.stdout.splitlines()]

    # 13:00 at +02:00 is 11:00 UTC
    assert listed("--since", "2024-01-01T13:00:00+02:00", "--until", "2024-01-02") == [
        str(old[1]), str(old[2]),
    ]  # fmt: skip
    assert listed("--since", "1h") == [str(fresh)]
    assert listed("--until", "1h") == [str(i) for i in old]
    assert listed("--aggregate-id", "a-2") == [str(old[2])]
    assert listed("--aggregate-id", "o-new", "--since", "2024-01-01") == [str(fresh)]


def test_cli_replay_unpublished_rows_to_their_topic_marks_them(
    pg: Pg, kafka_broker: KafkaBroker
) -> None:
    kind = f"ship{tag()}"
    topic = new_topic(kafka_broker, f"outbox.event.{kind}")
    ids = pg.write_many(3, kind)
    pg.set(ids[:1], published_at=T0)
    result = on(
        pg.url, "outbox", "replay", "--aggregate-type", kind, "--yes", "--json",
        "--brokers", kafka_broker.bootstrap,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert (doc["selected"], doc["sent"], doc["marked_published"], doc["failed"]) == (3, 3, 2, [])
    assert set(by_id(read_topic(kafka_broker, topic, 3))) == {str(i) for i in ids}
    rows = pg.rows()
    assert rows[ids[0]]["published_at"] == T0  # already published: left as it was
    assert all(rows[i]["published_at"] is not None for i in ids[1:])
    # the relay has nothing left to send
    assert Relay(pg.store, relay_options(kafka_broker)).run().published == 0
    assert len(read_topic(kafka_broker, topic, 3)) == 3


def test_cli_replay_one_row_by_id_does_not_ask(pg: Pg, kafka_broker: KafkaBroker) -> None:
    target = new_topic(kafka_broker)
    ids = pg.write_many(2, "order")
    result = on(
        pg.url, "outbox", "replay", "--id", str(ids[1]), "--to-topic", target,
        "--brokers", kafka_broker.bootstrap,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "replayed 1 of 1 row(s)" in result.stdout
    assert set(by_id(read_topic(kafka_broker, target, 1))) == {str(ids[1])}


def test_cli_replay_declined_sends_nothing(pg: Pg, kafka_broker: KafkaBroker) -> None:
    target = new_topic(kafka_broker)
    pg.write_many(2, "order")
    result = on(
        pg.url, "outbox", "replay", "--aggregate-type", "order", "--to-topic", target,
        "--brokers", kafka_broker.bootstrap, input="n\n",
    )  # fmt: skip
    assert result.exit_code == 6, result.stdout + result.stderr
    assert read_topic(kafka_broker, target, 0) == []


@pytest.mark.parametrize(
    ("args", "mentions"),
    [
        ([], "choose rows"),
        (["--since", "last tuesday"], "--since"),
        (["--until", "2024-13-45T99:00"], "--until"),
        (["--id", "not-a-uuid"], "--id"),
        (["--aggregate-type", "x", "--topic-template", "t.{nope}"], "nope"),
    ],
    ids=["no-selector", "bad-since", "bad-until", "bad-id", "bad-template"],
)
def test_cli_replay_usage_errors_exit_2(pg: Pg, args: list[str], mentions: str) -> None:
    (row_id,) = pg.write_many(1, "x")
    result = on(pg.url, "outbox", "replay", "--brokers", dead_brokers(), "--yes", *args)
    assert result.exit_code == 2, result.stdout + result.stderr
    assert mentions in result.stderr
    assert pg.rows()[row_id]["published_at"] is None


def test_cli_outbox_on_sqlite_exits_2_naming_postgresql(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path}/idem.db"
    with open_store(url) as store:
        store.provision()
    for args in (
        ["replay", "--aggregate-type", "x", "--dry-run"],
        ["status"],
        ["purge", "--older-than", "1d"],
    ):
        result = on(url, "outbox", *args)
        assert result.exit_code == 2, (args, result.stdout, result.stderr)
        assert "PostgreSQL" in result.stderr


def test_cli_outbox_on_an_unprovisioned_schema_exits_4(postgres_server: PostgresServer) -> None:
    url = postgres_server.url(schema=unique_schema())
    for args in (
        ["replay", "--aggregate-type", "x", "--dry-run"],
        ["replay", "--aggregate-type", "x", "--yes", "--brokers", dead_brokers()],
        ["status"],
        ["purge", "--older-than", "1d", "--yes"],
        ["relay", "--brokers", dead_brokers(), "--exit-when-idle", "1s"],
    ):
        result = on(url, "outbox", *args)
        assert result.exit_code == 4, (args, result.stdout, result.stderr)
        assert "idemctl init" in result.stderr


def test_cli_relay_that_cannot_deliver_exits_1_naming_the_brokers(pg: Pg) -> None:
    ids = pg.write_many(3, "order")
    brokers = dead_brokers()
    args = [
        "outbox", "relay", "--brokers", brokers, "--delivery-timeout", "1s",
        "--exit-when-idle", "1s", "--poll-interval", "100ms", "--backoff", "60s",
    ]  # fmt: skip
    result = on(pg.url, *args)
    assert result.exit_code == 1, result.stdout + result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 3 outbox row(s) not delivered to the brokers at "), last
    assert brokers in last
    assert "relayed 0 event(s) in 1 batch(es); 3 delivery failure(s)" in result.stderr
    assert all(r["published_at"] is None and r["attempts"] == 1 for r in pg.rows().values())

    pg.set(ids, retry_at=pg.now())  # due again
    as_json = on(pg.url, *args, "--json")
    assert as_json.exit_code == 1, as_json.stdout + as_json.stderr
    doc = json.loads(as_json.stdout)
    assert (doc["brokers"], doc["published"], doc["failed"], doc["undelivered"]) == (
        brokers, 0, 3, 3,
    )  # fmt: skip
    assert doc["delivery_error"] and doc["store"] == pg.url
    assert doc["store_source"] == "--store"


def test_cli_relay_that_delivered_everything_exits_0(pg: Pg, kafka_broker: KafkaBroker) -> None:
    topic = new_topic(kafka_broker)
    pg.write_many(2, "order")
    result = on(
        pg.url, "outbox", "relay", "--brokers", kafka_broker.bootstrap,
        "--topic-template", topic, "--exit-when-idle", "1s", "--poll-interval", "100ms",
        "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert (doc["published"], doc["failed"], doc["undelivered"]) == (2, 0, 0)
    assert doc["delivery_error"] is None


def test_cli_replay_reports_failed_deliveries_and_exits_1(pg: Pg) -> None:
    ids = pg.write_many(2, "order")
    result = on(
        pg.url, "outbox", "replay", "--aggregate-type", "order", "--yes", "--json",
        "--brokers", dead_brokers(), "--delivery-timeout", "1s",
    )  # fmt: skip
    assert result.exit_code == 1, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert (doc["selected"], doc["sent"], doc["marked_published"]) == (2, 0, 0)
    assert sorted(f["id"] for f in doc["failed"]) == sorted(str(i) for i in ids)
    assert all(f["error"] for f in doc["failed"])
    assert all(r["published_at"] is None for r in pg.rows().values())


# 6. Upgrading a schema from before seq/retry_at ---------------------------------------------------


def test_upgrade_from_migration_2(postgres_server: PostgresServer) -> None:
    schema = unique_schema()
    url = postgres_server.url(schema=schema)
    try:
        with open_store(url) as store:
            store.provision(upto=2)  # type: ignore[call-arg]
            assert store.schema_version() == 2  # type: ignore[attr-defined]
            with store.connection() as conn:  # type: ignore[attr-defined]
                columns = {
                    r[0]
                    for r in conn.execute(
                        "SELECT column_name FROM information_schema.columns "
                        "WHERE table_schema = %s AND table_name = 'outbox'",
                        (schema,),
                    )
                }
            assert "seq" not in columns and "retry_at" not in columns
            ids = []
            for i in range(3):  # the writer works on the old table too
                with store.connection() as conn, conn.transaction():  # type: ignore[attr-defined]
                    ids.append(add(conn, "order", f"o-{i}", "Made", {"i": i}, schema=schema))
            table = OutboxTable(store)
            with pytest.raises(NotProvisioned, match="idemctl init"):
                table.check()
            old = on(url, "outbox", "status")
            assert old.exit_code == 4, old.stdout + old.stderr

            store.provision()
            latest = max(migrations(store.names))  # type: ignore[attr-defined]
            assert store.schema_version() == latest  # type: ignore[attr-defined]
            table.check()
            with store.connection() as conn:  # type: ignore[attr-defined]
                seqs = dict(conn.execute(f"SELECT id, seq FROM {table.name}").fetchall())
            assert set(seqs) == set(ids)
            assert all(isinstance(s, int) for s in seqs.values())
            assert len(set(seqs.values())) == 3
            # rows written after the upgrade come after them
            with store.connection() as conn, conn.transaction():  # type: ignore[attr-defined]
                newer = add(conn, "order", "o-9", "Made", {"i": 9}, schema=schema)
            with store.connection() as conn:  # type: ignore[attr-defined]
                (newer_seq,) = conn.execute(
                    f"SELECT seq FROM {table.name} WHERE id = %s", (newer,)
                ).fetchone()
            assert newer_seq > max(seqs.values())
            assert table.status().types[0].unpublished == 4
    finally:
        drop_schema(postgres_server, schema)


def test_replay_library_selects_and_counts(pg: Pg) -> None:
    ids = pg.write_many(4, "order")
    replay = Replay(pg.store, Selection(ids=(ids[3], ids[1])), to_topic="anywhere")
    assert replay.count() == 2
    assert [r.id for r in replay.rows()] == [ids[1], ids[3]]
    assert replay.topic_of(replay.rows()[0]) == "anywhere"
    own = Replay(pg.store, Selection(aggregatetype="order"), topic_template="{type}.{aggregateid}")
    assert [own.topic_of(r) for r in own.rows()] == [f"Made.a-{i}" for i in range(4)]
    with pytest.raises(ConfigError):
        Replay(pg.store, Selection(aggregatetype="order"), topic_template="{nope}")


def test_doctor_reports_the_outbox_backlog(pg: Pg) -> None:
    """doctor looks at the unpublished rows: none or fresh ones are fine; a failing delivery
    or a row left waiting longer than OUTBOX_LAG is a problem with its fix (exit 1)."""

    def outbox_finding() -> tuple[int, dict[str, Any]]:
        result = on(pg.url, "doctor", "--json")
        doc = json_doc(result, "doctor.schema.json")
        return result.exit_code, next(f for f in doc["findings"] if f["name"] == "outbox")

    code, finding = outbox_finding()
    assert (code, finding["ok"], finding["detail"]) == (
        0,
        True,
        "no outbox row waits to be published",
    )

    fresh = pg.write_many(3, "order")
    code, finding = outbox_finding()
    assert (code, finding["ok"]) == (0, True)
    assert finding["detail"].startswith("3 outbox row(s) unpublished")

    pg.set(fresh[:1], attempts=2, last_error="broker down")
    code, finding = outbox_finding()
    assert (code, finding["ok"]) == (1, False)
    assert "1 with failed deliveries" in finding["detail"]
    assert "idemctl outbox status" in finding["fix"]

    pg.set(fresh[:1], attempts=0, last_error=None)
    pg.set(fresh, created_at=pg.now() - timedelta(minutes=10))
    code, finding = outbox_finding()
    assert (code, finding["ok"]) == (1, False)
    assert "the oldest for 10m" in finding["detail"]
    assert "idemctl outbox relay" in finding["fix"]

    pg.set(fresh, published_at=pg.now())
    code, finding = outbox_finding()
    assert (code, finding["ok"]) == (0, True)
