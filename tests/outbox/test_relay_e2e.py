"""The outbox end to end, with real processes: `idemctl consume --transactional` writes
effects and outbox rows in one PostgreSQL transaction, `idemctl outbox relay` publishes them
to the real broker (tansu). Relays are SIGKILLed between produce and mark, run side by side,
stopped with SIGTERM, and killed over and over: an event may appear twice, always with the
same id and payload, and is never lost; a row is marked published only once it is on the
topic."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import idemctl.outbox
from idemctl import open_store
from idemctl.outbox.table import TAKE_MARK
from tests.backends import unique_schema
from tests.consume.test_consume import produce, read_all
from tests.polling import wait_until
from tests.scrape import dashboard_metrics, probe, scrape
from tests.servers import KafkaBroker, PostgresServer, free_port
from tests.traces import spans_of

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 3
STOP_TIMEOUT = 20.0


# Processes -------------------------------------------------------------------------------------


@dataclass
class Proc:
    """One `python -m idemctl` child, its output in files (a full pipe cannot block it)."""

    name: str
    popen: subprocess.Popen[bytes]
    out: Path
    err: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout)

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def summary(self) -> dict[str, Any]:
        """The relay's --json summary: the last JSON line on stdout."""
        lines = [line for line in self.stdout().splitlines() if line.startswith("{")]
        assert lines, f"{self.name}: no JSON summary on stdout; stderr:\n{self.stderr()[-2000:]}"
        return dict(json.loads(lines[-1]))

    def describe(self) -> str:
        return (
            f"{self.name} (pid {self.pid}, exit {self.popen.returncode})\n"
            f"stdout:\n{self.stdout()[-1500:]}\nstderr:\n{self.stderr()[-3000:]}"
        )


@dataclass
class Spawner:
    """Starts idemctl processes in the test's directory; ``stop_all`` stops every one still
    running by its PID (SIGTERM, then SIGKILL), and reaps them."""

    cwd: Path
    env: dict[str, str]
    procs: list[Proc] = field(default_factory=list)

    def start(self, name: str, *args: str) -> Proc:
        n = len(self.procs)
        out, err = self.cwd / f"{n:03d}-{name}.out", self.cwd / f"{n:03d}-{name}.err"
        with open(out, "wb") as o, open(err, "wb") as e:
            popen = subprocess.Popen(
                [sys.executable, "-m", "idemctl", *args],
                cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL, stdout=o, stderr=e,
            )  # fmt: skip
        proc = Proc(name, popen, out, err)
        self.procs.append(proc)
        return proc

    def run(self, name: str, *args: str, timeout: float = 60.0) -> Proc:
        """Start and wait for the exit; killed by its PID if it outlives ``timeout``."""
        proc = self.start(name, *args)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill(proc)
            pytest.fail(f"{name} still running after {timeout}s:\n{proc.describe()}")
        return proc

    @staticmethod
    def kill(proc: Proc) -> None:
        if proc.popen.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.popen.wait()

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.popen.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.popen.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.kill(proc)


# The test's own schema, topics and processes ---------------------------------------------------


@dataclass
class World:
    pg: PostgresServer
    broker: KafkaBroker
    schema: str
    url: str
    tag: str
    spawner: Spawner

    @property
    def template(self) -> str:
        return f"t-{self.tag}-{{aggregatetype}}"

    def topic(self, aggregatetype: str = "order") -> str:
        return f"t-{self.tag}-{aggregatetype}"

    @property
    def kafka_pairs(self) -> list[str]:
        config = self.broker.client_config()
        return [x for k, v in config.items() if k != "bootstrap.servers"
                for x in ("--kafka-config", f"{k}={v}")]  # fmt: skip

    def relay_args(self, *options: str, url: str | None = None) -> list[str]:
        return [
            "--store", url or self.url, "outbox", "relay", "--json",
            "--brokers", self.broker.bootstrap, "--topic-template", self.template,
            "--delivery-timeout", "20s", *options,
        ]  # fmt: skip

    def relay(self, *options: str, url: str | None = None, name: str = "relay") -> Proc:
        return self.spawner.start(name, *self.relay_args(*options, url=url))

    def relay_to_idle(self, *options: str, timeout: float = 90.0, name: str = "relay") -> Proc:
        proc = self.spawner.run(
            name, *self.relay_args("--exit-when-idle", "3s", *options), timeout=timeout
        )
        assert proc.popen.returncode == 0, proc.describe()
        return proc

    def status(self) -> dict[str, Any]:
        proc = self.spawner.run("status", "--store", self.url, "outbox", "status", "--json")
        assert proc.popen.returncode == 0, proc.describe()
        return dict(json.loads(proc.stdout()))

    def write(
        self,
        count: int,
        start: int = 0,
        aggregatetype: str = "order",
        aggregates: int | None = None,
    ) -> dict[str, Row]:
        """``count`` outbox rows in one transaction through idemctl.outbox.add; each of an
        aggregate of its own, or of one of ``aggregates`` in turn (payload ``n``: the
        order they were written in)."""
        rows: dict[str, Row] = {}
        with self.pg.connect() as conn, conn.transaction():
            for i in range(start, start + count):
                a = i if aggregates is None else i % aggregates
                aggregateid = f"ördér-{a}" if a % 5 == 0 else f"order-{a}"  # keys are UTF-8
                type_ = "OrderPlaced" if i % 2 == 0 else "OrderShipped"
                payload: Any = {"order": aggregateid, "cents": 100 + i, "note": "über", "n": i}
                if i % 97 == 0:
                    payload = None  # a tombstone
                headers = {"source": "e2e", "batch": str(start)}
                row_id = idemctl.outbox.add(
                    conn, aggregatetype, aggregateid, type_, payload, headers, schema=self.schema
                )
                rows[str(row_id)] = Row(aggregateid, type_, payload, headers)
        return rows

    def published(self) -> set[str]:
        with self.pg.connect() as conn:
            found = conn.execute(
                f"SELECT id::text FROM {self.schema}.outbox WHERE published_at IS NOT NULL"
            ).fetchall()
        return {r[0] for r in found}

    def unpublished(self) -> int:
        with self.pg.connect() as conn:
            row = conn.execute(
                f"SELECT count(*) FROM {self.schema}.outbox WHERE published_at IS NULL"
            ).fetchone()
        assert row is not None
        return int(row[0])

    def backends(self, condition: str) -> list[int]:
        """PIDs of server backends whose current or last query touched this test's outbox
        and that meet ``condition`` (SQL on pg_stat_activity)."""
        with self.pg.connect() as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                f"AND query LIKE %s AND {condition}",
                (f"%{self.schema}%outbox%",),
            ).fetchall()
        return [r[0] for r in rows]


@dataclass(frozen=True)
class Row:
    aggregateid: str
    type: str
    payload: Any
    headers: dict[str, str]


@dataclass(frozen=True)
class Seen:
    """One message read back from a relay's topic."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]

    @property
    def id(self) -> str:
        return self.header("id")

    def header(self, name: str) -> str:
        values = [v for k, v in self.headers if k == name]
        assert len(values) == 1, f"header {name!r} in {self.headers}"
        return values[0].decode()

    def copy(self) -> tuple[Any, ...]:
        """What two copies of one event must share."""
        return (self.topic, self.key, self.value, self.headers)


@pytest.fixture
def world(
    postgres_server: PostgresServer, kafka_broker: KafkaBroker, tmp_path: Path
) -> Iterator[World]:
    schema = unique_schema()
    url = postgres_server.url(schema=schema)
    with open_store(url) as store:
        store.provision()
    tag = uuid.uuid4().hex[:12]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])}
    env.pop("IDEMCTL_STORE", None)
    env.pop("IDEMCTL_BROKERS", None)
    spawner = Spawner(tmp_path, env)
    w = World(postgres_server, kafka_broker, schema, url, tag, spawner)
    kafka_broker.create_topic(w.topic(), partitions=PARTITIONS)
    try:
        yield w
    finally:
        spawner.stop_all()


def read_topic(
    broker: KafkaBroker, topic: str, expect: int, timeout: float = 30.0, settle: float = 1.5
) -> list[Seen]:
    """Every message on ``topic`` from the start (partitions assigned, no group join):
    polls until ``expect`` arrived or ``timeout``, then ``settle`` more seconds so that
    anything beyond ``expect`` shows up in the assertions."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition
    from confluent_kafka import Consumer as KafkaConsumer

    c = KafkaConsumer(
        broker.client_config(
            **{"group.id": f"reader-{uuid.uuid4().hex}", "enable.auto.commit": False}
        )
    )
    out: list[Seen] = []
    try:
        partitions = c.list_topics(topic, timeout=10).topics[topic].partitions
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        deadline = time.monotonic() + timeout
        quiet_until: float | None = None
        while True:
            now = time.monotonic()
            if len(out) >= expect and quiet_until is None:
                quiet_until = now + settle
            if now > deadline or (quiet_until is not None and now > quiet_until):
                break
            for m in c.consume(num_messages=1000, timeout=0.3):
                if m.error() is None:
                    out.append(
                        Seen(m.topic(), m.partition(), m.offset(), m.key(), m.value(),
                             tuple((k, v) for k, v in m.headers() or []))
                    )  # fmt: skip
    finally:
        c.close()
    return out


def by_id(seen: list[Seen]) -> dict[str, list[Seen]]:
    copies: dict[str, list[Seen]] = defaultdict(list)
    for m in seen:
        copies[m.id].append(m)
    return dict(copies)


def check_messages(world: World, rows: dict[str, Row], seen: list[Seen]) -> None:
    """Each message is the row its id names: topic, key, type, payload, extra headers."""
    for m in seen:
        assert m.id in rows, f"a message with an id not in the outbox: {m}"
        row = rows[m.id]
        assert m.topic == world.topic()
        assert m.key == row.aggregateid.encode()
        assert m.header("type") == row.type
        if row.payload is None:
            assert m.value is None  # a tombstone
        else:
            assert (
                m.value
                == json.dumps(
                    row.payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False
                ).encode()
            )  # canonical JSON: sorted keys, compact, UTF-8
        # id and type first, then the row's own headers (jsonb keeps no key order)
        assert m.headers[:2] == (("id", m.id.encode()), ("type", row.type.encode()))
        assert sorted(m.headers[2:]) == sorted((k, v.encode()) for k, v in row.headers.items())


def check_order(seen: list[Seen]) -> None:
    """Per aggregate (key), in partition order, the first copies of its events come in the
    order they were written (payload ``n``); every aggregate keeps to one partition."""
    by_key: dict[bytes | None, list[Seen]] = defaultdict(list)
    for m in seen:
        by_key[m.key].append(m)
    for key, messages in by_key.items():
        assert len({m.partition for m in messages}) == 1, f"{key!r} spans partitions"
        firsts: dict[str, int] = {}
        for m in sorted(messages, key=lambda m: m.offset):
            if m.value is not None:  # (a tombstone carries no n)
                firsts.setdefault(m.id, json.loads(m.value)["n"])
        order = list(firsts.values())
        assert order == sorted(order), f"{key!r}: first copies in the order {order}"


RELAY_LOOKS = f"(query LIKE 'SELECT seq, retry_at%%' OR query LIKE '/* {TAKE_MARK} */%%')"
"""A backend of a relay: its table check or its take (see ``World.backends``)."""


def wait_for(what: str, condition: Any, timeout: float, interval: float = 0.05) -> None:
    """``condition`` within ``timeout`` (tests/polling.py's, in this file's order)."""
    wait_until(condition, what, timeout, interval)


# 1. End to end ----------------------------------------------------------------------------------

HANDLER = '''
"""Books an order (one effect row) and announces it twice, in the key's own transaction."""

from idemctl.consume import Event
from idemctl.runner import Context


def handle(event: Event, ctx: Context) -> dict:
    order = event.json()
    ctx.connection.execute(
        "INSERT INTO {schema}.effects (key, cents, fencing_token) VALUES (%s, %s, %s)",
        (ctx.key, order["cents"], ctx.fencing_token),
    )
    placed = ctx.outbox.add(
        "order", ctx.key, "OrderPlaced", {{"order": ctx.key, "cents": order["cents"]}}
    )
    billed = ctx.outbox.add(
        "order", ctx.key, "OrderBilled", {{"order": ctx.key, "billed": order["cents"]}},
        headers={{"currency": "EUR"}},
    )
    return {{"placed": str(placed), "billed": str(billed)}}
'''


def test_consume_writes_effects_and_events_once_and_the_relay_publishes_each_once(
    world: World,
) -> None:
    source = f"orders-{world.tag}"
    world.broker.create_topic(source, partitions=PARTITIONS)
    with world.pg.connect() as conn:
        conn.execute(
            f"CREATE TABLE {world.schema}.effects "
            "(key text NOT NULL, cents bigint NOT NULL, fencing_token bigint NOT NULL)"
        )
    (world.spawner.cwd / "orders.py").write_text(HANDLER.format(schema=world.schema))
    rng = random.Random(3)
    keys = [f"ord-{i}" for i in range(210)]
    messages = [{"value": {"cents": 100 + i}, "idem": k, "kkey": k.encode()}
                for i, k in enumerate(keys)]  # fmt: skip
    dupes = [dict(m) for m in rng.sample(messages, 90)]
    for i, m in enumerate(dupes):  # half of them under another Kafka key: another partition
        m["kkey"] = m["kkey"] + (b"-elsewhere" if i % 2 else b"")
    everything = messages + dupes
    rng.shuffle(everything)
    assert len(everything) == 300
    produce(world.broker, source, everything)

    consumer = world.spawner.run(
        "consume", "--store", world.url, "consume", "--brokers", world.broker.bootstrap,
        "--topic", source, "--group", f"g-{world.tag}", "--handler", "orders:handle",
        "--transactional", "--exit-when-idle", "10s", "--batch-size", "50",
        *world.kafka_pairs, timeout=120,
    )  # fmt: skip
    assert consumer.popen.returncode == 0, consumer.describe()

    with world.pg.connect() as conn:
        effects = Counter(
            dict(conn.execute(f"SELECT key, count(*) FROM {world.schema}.effects GROUP BY key"))
        )
        outbox = conn.execute(
            f"SELECT id::text, aggregatetype, aggregateid, type, payload, headers, published_at "
            f"FROM {world.schema}.outbox"
        ).fetchall()
    assert effects == Counter({k: 1 for k in keys})  # each key's effect exactly once
    per_key = Counter(r[2] for r in outbox)
    assert per_key == Counter({k: 2 for k in keys})  # two events per key, none twice
    assert {(r[2], r[3]) for r in outbox} == {
        (k, t) for k in keys for t in ("OrderPlaced", "OrderBilled")
    }
    assert {r[1] for r in outbox} == {"order"}
    assert all(r[6] is None for r in outbox)  # nothing relayed yet

    relay = world.relay_to_idle()
    assert relay.summary()["published"] == 420
    assert relay.summary()["failed"] == 0

    rows = {r[0]: Row(r[2], r[3], r[4], r[5]) for r in outbox}
    assert world.published() == set(rows)
    seen = read_topic(world.broker, world.topic(), expect=len(rows))
    check_messages(world, rows, seen)
    assert Counter(m.id for m in seen) == Counter({i: 1 for i in rows})  # all, each once
    cents = {k: 100 + i for i, k in enumerate(keys)}
    events: dict[str, dict[str, Seen]] = defaultdict(dict)
    for m in seen:
        key = (m.key or b"").decode()
        events[key][m.header("type")] = m
        name = "cents" if m.header("type") == "OrderPlaced" else "billed"
        assert json.loads(m.value or b"") == {"order": key, name: cents[key]}
    assert set(events) == set(keys)
    for key, two in events.items():
        placed, billed = two["OrderPlaced"], two["OrderBilled"]
        assert billed.header("currency") == "EUR"
        # one aggregate, one partition, in the order the handler wrote them
        assert placed.partition == billed.partition, key
        assert placed.offset < billed.offset, key
    status = world.status()
    assert status["total"]["unpublished"] == 0
    assert status["total"]["published"] == 420
    assert status["total"]["failing"] == 0
    assert [t["aggregatetype"] for t in status["types"]] == ["order"]


# 2. Killed between produce and mark ---------------------------------------------------------------


def test_a_relay_killed_after_producing_before_marking_leaves_rows_to_publish_again(
    world: World,
) -> None:
    rows = world.write(50)
    patient = world.pg.url(schema=world.schema, statement_timeout="60s")
    locker = world.pg.connect(autocommit=False)
    try:
        # SHARE lets the relay's SELECT ... FOR UPDATE through and blocks its UPDATE.
        locker.execute(f"LOCK TABLE {world.schema}.outbox IN SHARE MODE")
        relay_a = world.relay(url=patient, name="relay-a")
        try:
            seen = []

            def all_produced() -> bool:
                nonlocal seen
                assert relay_a.popen.poll() is None, relay_a.describe()
                seen = read_topic(world.broker, world.topic(), expect=50, timeout=1, settle=0)
                return len({m.id for m in seen}) >= 50

            wait_for("relay A produced all 50 rows", all_produced, timeout=45, interval=0.2)
            # Relay A has them on the topic and now waits on the lock to mark them.
            wait_for(
                "relay A's UPDATE waits on the table lock",
                lambda: world.backends("wait_event_type = 'Lock' AND query LIKE 'UPDATE%%'"),
                timeout=15,
            )
            held = world.backends("wait_event_type = 'Lock' AND query LIKE 'UPDATE%%'")
            os.kill(relay_a.pid, signal.SIGKILL)
            relay_a.popen.wait(STOP_TIMEOUT)
        finally:
            Spawner.kill(relay_a)
        locker.rollback()
    finally:
        locker.close()
    # The dead relay's backend runs its UPDATE once the lock is gone, finds its client gone
    # and rolls back: it never committed.
    wait_for(
        "the killed relay's server backend is gone",
        lambda: not world.backends(f"pid = ANY(ARRAY{held}::int[])"),
        timeout=15,
    )
    assert world.published() == set()
    assert world.unpublished() == 50
    first = read_topic(world.broker, world.topic(), expect=50, settle=0.5)
    assert Counter(m.id for m in first) == Counter({i: 1 for i in rows})

    relay_b = world.relay_to_idle(name="relay-b")
    assert relay_b.summary()["published"] == 50
    assert world.published() == set(rows)
    assert world.unpublished() == 0
    seen = read_topic(world.broker, world.topic(), expect=100)
    check_messages(world, rows, seen)
    copies = by_id(seen)
    assert Counter({i: len(c) for i, c in copies.items()}) == Counter({i: 2 for i in rows})
    for row_id, (one, two) in copies.items():
        assert one.copy() == two.copy(), row_id  # the same id, key, payload and headers


# 3. Two relays side by side -------------------------------------------------------------------


def test_two_relays_at_once_publish_each_row_exactly_once(world: World) -> None:
    rows = world.write(200)
    # Idle for 15 s before exiting: a relay that finishes the first rows before the other
    # has even started must still be there when it looks (CI: not both within 30 s).
    a = world.relay("--batch-size", "50", "--exit-when-idle", "15s", name="relay-a")
    b = world.relay("--batch-size", "50", "--exit-when-idle", "15s", name="relay-b")
    # Both at work (each has taken rows or looked for them) before most rows are written.
    # Each seen looking at some poll (a backend's last query moves on to its marks and
    # commits): not both at the same instant, which a loaded machine may never show.
    looked: set[int] = set()

    def both_looked() -> bool:
        looked.update(world.backends(RELAY_LOOKS))
        return len(looked) >= 2

    wait_for("both relays look at the outbox", both_looked, 30)
    for start in range(200, 2000, 150):  # the rest while the relays run
        before = len(world.published())
        rows |= world.write(min(150, 2000 - start), start=start)
        wait_for("the relays go on meanwhile", lambda: len(world.published()) > before, 60)  # noqa: B023
    assert len(rows) == 2000
    for proc in (a, b):
        proc.wait(120)
        assert proc.popen.returncode == 0, proc.describe()
    published = {p.name: p.summary()["published"] for p in (a, b)}
    print(f"two relays: {published}")
    assert sum(published.values()) == 2000
    assert world.published() == set(rows)
    seen = read_topic(world.broker, world.topic(), expect=2000, timeout=60)
    check_messages(world, rows, seen)
    assert Counter(m.id for m in seen) == Counter({i: 1 for i in rows})
    assert all(n > 0 for n in published.values()), f"one relay did everything: {published}"


# 4. SIGTERM ------------------------------------------------------------------------------------


def test_sigterm_finishes_the_batch_in_hand_and_marks_only_what_is_on_the_topic(
    world: World,
) -> None:
    rows = world.write(500)
    port = free_port()
    relay = world.relay(
        "--batch-size", "100", "--poll-interval", "100ms",
        "--metrics-port", str(port), "--metrics-host", "127.0.0.1",
    )  # fmt: skip
    wait_for("the relay published some rows", lambda: len(world.published()) > 0, 30, 0.01)
    samples, types = scrape(port)
    counted = samples[("idemctl_outbox_events_total", (("outcome", "published"),))]
    assert 0 < counted <= len(world.published())  # counted once committed
    assert counted % 100 == 0
    assert types["idemctl_outbox_batches"] == "counter"
    assert probe(port, "/readyz") == (200, "ready\n")
    exposed = {name for name, _ in samples}
    assert {m for m in dashboard_metrics() if m.startswith("idemctl_outbox_")} <= exposed
    relay.popen.send_signal(signal.SIGTERM)
    started = time.monotonic()
    try:
        relay.wait(30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"no exit within 30s of SIGTERM:\n{relay.describe()}")
    print(f"exited {time.monotonic() - started:.2f}s after SIGTERM")
    assert relay.popen.returncode == 0, relay.describe()
    assert "SIGTERM: finishing the work in hand" in relay.stderr()
    published = world.published()
    assert relay.summary()["published"] == len(published)
    assert len(published) % 100 == 0  # whole batches
    seen = read_topic(world.broker, world.topic(), expect=len(published), settle=2.0)
    check_messages(world, rows, seen)
    seen_ids = Counter(m.id for m in seen)
    assert published <= set(seen_ids)  # every row marked published is on the topic
    assert set(seen_ids) <= published  # and nothing is on the topic that is not marked
    assert [i for i, n in seen_ids.items() if n > 1] == []
    print(f"{len(published)} of 500 published before SIGTERM")


def test_sigterm_while_marking_waits_on_a_lock_still_marks_the_batch_in_hand(
    world: World,
) -> None:
    rows = world.write(50)
    locker = world.pg.connect(autocommit=False)
    try:
        locker.execute(f"LOCK TABLE {world.schema}.outbox IN SHARE MODE")
        relay = world.relay()
        wait_for(
            "the relay's UPDATE waits on the table lock",
            lambda: world.backends("wait_event_type = 'Lock' AND query LIKE 'UPDATE%%'"),
            timeout=30,
        )
        relay.popen.send_signal(signal.SIGTERM)
        wait_for(
            "the relay hears SIGTERM",
            lambda: "SIGTERM: finishing the work in hand" in relay.stderr(),
            timeout=30,
        )
        # heard, and still finishing its batch: its UPDATE still waits on the lock
        assert relay.popen.poll() is None, relay.describe()
        assert world.backends("wait_event_type = 'Lock' AND query LIKE 'UPDATE%%'"), (
            relay.describe()
        )
        assert world.published() == set()
        locker.rollback()
    finally:
        locker.close()
    try:
        relay.wait(20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"no exit within 20s of the lock's release:\n{relay.describe()}")
    assert relay.popen.returncode == 0, relay.describe()
    assert relay.summary()["published"] == 50
    assert world.published() == set(rows)
    seen = read_topic(world.broker, world.topic(), expect=50)
    check_messages(world, rows, seen)
    assert Counter(m.id for m in seen) == Counter({i: 1 for i in rows})


# 5. Chaos ----------------------------------------------------------------------------------------

CHAOS_ROWS = 3000
CHAOS_AGGREGATES = 150
"""The chaos rows are 20 events of each of these aggregates, interleaved."""
CHAOS_KILLS = 12
"""Relays killed in the chaos; then one drains what is left."""
CHAOS_BATCH = 25
MARK_WAITS = "wait_event_type = 'Lock' AND query LIKE 'UPDATE %%published_at = now()%%'"
"""A relay's backend whose mark (of a batch it has produced) waits on the table's lock."""


def hold_the_lock_now_and_then(world: World, rng: random.Random, stop: threading.Event) -> None:
    """Take a SHARE lock on the outbox for 0.1-0.4 s, let go for 0.05-0.1 s, until ``stop``:
    relays produce their batch and then wait to mark it, the window a kill must hit."""
    conn = world.pg.connect(autocommit=False)
    try:
        while not stop.is_set():
            conn.execute(f"LOCK TABLE {world.schema}.outbox IN SHARE MODE")
            stop.wait(rng.uniform(0.1, 0.4))
            conn.rollback()
            stop.wait(rng.uniform(0.05, 0.1))
    finally:
        conn.rollback()
        conn.close()


def test_relays_killed_again_and_again_lose_no_event(world: World) -> None:
    """A relay is SIGKILLed and started again CHAOS_KILLS times; then one drains the outbox.
    The table is locked now and then (SHARE: a relay takes and produces its batch, and its
    mark waits), and each kill lands once the relay has marked 0-3 batches (of 25) and its
    next mark waits on the lock: a batch produced and never marked, every time, whatever
    the machine's speed (the kills once came 0.25-0.75 s after a look, and on a loaded
    machine all 35 came before the first produce). Each aggregate's events stay in the
    order they were written: duplicates come after their first copy, and no first copy
    comes ahead of an earlier event's first copy."""
    rows = world.write(CHAOS_ROWS, aggregates=CHAOS_AGGREGATES)
    rng = random.Random(5)
    kills, rounds = 0, 0
    stop = threading.Event()
    locker = threading.Thread(target=hold_the_lock_now_and_then, args=(world, rng, stop))
    locker.start()
    started = time.monotonic()
    try:
        while kills < CHAOS_KILLS and (unpublished := world.unpublished()) > 0:
            before = set(world.backends("true"))
            relay = world.relay(
                "--batch-size", str(CHAOS_BATCH), "--poll-interval", "100ms", name="chaos"
            )
            rounds += 1
            floor = unpublished - CHAOS_BATCH * rng.randrange(4)

            def due(relay: Proc = relay, before: set[int] = before, floor: int = floor) -> bool:
                assert relay.popen.poll() is None, relay.describe()
                left = world.unpublished()
                if left == 0:
                    return True  # drained before a mark had to wait
                return left <= floor and bool(set(world.backends(MARK_WAITS)) - before)

            try:
                wait_for("a relay's mark waiting on the lock", due, timeout=60)
                os.kill(relay.pid, signal.SIGKILL)
                kills += 1
                relay.popen.wait(STOP_TIMEOUT)
            finally:
                Spawner.kill(relay)
    finally:
        stop.set()
        locker.join(10)
    left = world.unpublished()
    print(
        f"chaos: {kills} kills in {rounds} rounds, {time.monotonic() - started:.1f}s, {left} left"
    )
    world.relay_to_idle(name="final")
    status = world.status()
    assert status["total"]["unpublished"] == 0
    assert status["total"]["published"] == CHAOS_ROWS
    assert world.published() == set(rows)

    seen = read_topic(world.broker, world.topic(), expect=CHAOS_ROWS, timeout=60, settle=3.0)
    check_messages(world, rows, seen)
    copies = by_id(seen)
    assert set(copies) == set(rows)  # none lost
    for row_id, same in copies.items():
        assert {m.copy() for m in same} == {same[0].copy()}, row_id  # copies are identical
    duplicates = sum(len(c) - 1 for c in copies.values())
    print(f"chaos: {kills} kills, {len(seen)} messages, {duplicates} duplicates")
    check_order(seen)
    assert kills >= 3, f"only {kills} kills: the relay finished too soon to test anything"
    assert duplicates > 0, "no kill landed between a produce and its mark"


TRACED_RELAY = r"""
from idemctl import open_store
from idemctl.outbox.relay import Relay, RelayOptions
from idemctl.outbox.writer import add

url, brokers, template, schema = sys.argv[1:5]
with open_store(url) as store:
    with store.connection() as conn, conn.transaction():
        with trace.get_tracer("app").start_as_current_span("handler"):
            add(conn, "order", "o-1", "created", {"n": 1}, schema=schema)
    options = RelayOptions(brokers, topic_template=template, exit_when_idle=1.0,
                           poll_interval=0.1)
    Relay(store, options).run()
"""


def test_an_event_written_in_a_trace_is_published_in_it(world: World) -> None:
    """``ctx.outbox.add`` under a span stores its traceparent with the event; the relay's
    ``idemctl.publish`` span continues that trace and the Kafka message carries it on."""
    found = spans_of(TRACED_RELAY, world.url, world.broker.bootstrap, world.template, world.schema)
    spans = {s["name"]: s for s in found}
    handler, publish = spans["handler"], spans["idemctl.publish"]
    assert (publish["trace"], publish["parent"]) == (handler["trace"], handler["id"])
    assert publish["kind"] == "PRODUCER"
    assert publish["attributes"]["idemctl.outcome"] == "published"
    assert publish["attributes"]["messaging.destination.name"] == world.topic()
    [message] = read_all(world.broker, world.topic(), 1)
    headers = dict(message.headers())
    version, trace, parent, _flags = headers["traceparent"].decode().split("-")
    assert (version, trace, parent) == ("00", handler["trace"], publish["id"])
