"""The dead-letter path never crashes the consumer: a message too large for librdkafka's
default producer limit still reaches the dead-letter topic (whole, or cut with
``--dlq-oversize truncate``), and a dead-letter topic that refuses writes pauses the message's
partition, with back-off, until it takes the dead letter; nothing past it is committed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.consume.test_consume import REPO, committed, kafka_flags, names, read_all
from tests.polling import wait_until
from tests.servers import HOST, KafkaBroker, RedisServer, free_port

BIG = 5 * 1024 * 1024
HANDLER = (
    "import os\n"
    "def handle(event, ctx):\n"
    "    if event.value.startswith(b'BAD'):\n"
    "        raise ValueError('this one always fails')\n"
    "    with open(os.environ['LEDGER'], 'a') as f:\n"
    "        f.write(ctx.key + '\\n')\n"
)


def produce_around(broker: KafkaBroker, topic: str, bad: bytes) -> None:
    """good-0, good-1, the bad message, good-2, good-3 on one partition."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap, "message.max.bytes": 20_000_000})
    for key, value in [
        ("good-0", b"{}"),
        ("good-1", b"{}"),
        ("bad", bad),
        ("good-2", b"{}"),
        ("good-3", b"{}"),
    ]:  # fmt: skip - one per message
        producer.produce(topic, value=value, headers=[("idempotency-key", key.encode())])
    assert producer.flush(60) == 0


def consume(
    broker: KafkaBroker, tmp_path: Path, topic: str, group: str, *extra: str
) -> subprocess.Popen[str]:
    (tmp_path / "h.py").write_text(HANDLER)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "idemctl",
            "--store",
            f"sqlite:///{tmp_path}/keys.db",
            "--json",
            "consume",
            "--brokers",
            broker.bootstrap,
            "--topic",
            topic,
            "--group",
            group,
            "--handler",
            "h:handle",
            "--exit-when-idle",
            "3s",
            "--max-attempts",
            "2",
            "--backoff",
            "0.2s",
            *kafka_flags(broker),
            *extra,
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}",
            "LEDGER": str(tmp_path / "ledger.txt"),
        },
    )  # fmt: skip - the command line reads as one


def ledger(tmp_path: Path) -> Counter[str]:
    return Counter((tmp_path / "ledger.txt").read_text().splitlines())


def test_a_5_mb_failing_message_reaches_the_dead_letter_topic_whole(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    bad = b"BAD" + os.urandom(BIG // 2).hex().encode()[: BIG - 3]
    produce_around(kafka_broker, topic, bad)
    proc = consume(kafka_broker, tmp_path, topic, group)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    assert ledger(tmp_path) == Counter(f"good-{i}" for i in range(4))  # each good one once
    [dead] = read_all(kafka_broker, f"{topic}.dlq", expect=1, timeout=60)
    assert dead.value() == bad  # whole
    assert dict(dead.headers())["idemctl-dlt-reason"] == b"failed 2 times"
    assert committed(kafka_broker, topic, group, 1) == {0: 5}


def test_dlq_oversize_truncate_cuts_the_payload_and_says_where_the_original_is(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    bad = b"BAD" + b"x" * (3 * 1024 * 1024)
    produce_around(kafka_broker, topic, bad)
    # The dead-letter producer may write at most 1 MB: the 3 MB dead letter is refused.
    limit = ("--kafka-config", "message.max.bytes=1000000")
    held = consume(kafka_broker, tmp_path, topic, group, *limit)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(held.stderr or ()), daemon=True)
    reader.start()
    # Refused, held (not crashed); tried again with back-off.
    wait_until(lambda: sum("neither handled nor dead-lettered" in line for line in lines) >= 3,
               "three refusals", procs=[held], detail=lambda: "".join(lines))  # fmt: skip
    held.terminate()
    held.wait(timeout=60)
    reader.join(10)
    err = "".join(lines)
    assert held.returncode == 0, err
    assert "neither handled nor dead-lettered" in err and "--dlq-oversize truncate" in err, err
    assert "Traceback" not in err, err
    assert committed(kafka_broker, topic, group, 1) == {0: 2}  # stopped at the bad one

    proc = consume(kafka_broker, tmp_path, topic, group, *limit, "--dlq-oversize", "truncate")
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert ledger(tmp_path) == Counter(f"good-{i}" for i in range(4))
    [dead] = read_all(kafka_broker, f"{topic}.dlq", expect=1, timeout=60)
    headers = dict(dead.headers())
    assert dead.value() == bad[: 64 * 1024]
    assert headers["idemctl-dlt-truncated"].startswith(str(len(bad)).encode())
    assert headers["kafka_dlt-original-topic"] == topic.encode()
    assert int.from_bytes(headers["kafka_dlt-original-offset"], "big") == 2
    assert committed(kafka_broker, topic, group, 1) == {0: 5}


class ProduceGate:
    """A TCP proxy in front of a broker that, while shut, cuts every connection that sends a
    Produce request (Kafka API key 0): the dead-letter producer cannot write, the consumer
    still fetches. Threads of ours, closed by ``close``."""

    def __init__(self, upstream: int) -> None:
        self.upstream, self.port = upstream, free_port()
        self.shut = threading.Event()
        self.cut = 0
        self._listener = socket.create_server((HOST, self.port))
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection((HOST, self.upstream))
            except OSError:  # the broker is down: so is this connection, as it would be
                client.close()
                continue
            self._sockets += [client, server]
            threading.Thread(target=self._requests, args=(client, server), daemon=True).start()
            threading.Thread(target=self._copy, args=(server, client), daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket) -> None:
        try:
            while True:
                size = _read(client, 4)
                body = _read(client, int.from_bytes(size, "big"))
                if self.shut.is_set() and int.from_bytes(body[:2], "big") == 0:
                    self.cut += 1
                    break
                server.sendall(size + body)
        except OSError:
            pass
        for s in (client, server):
            s.close()

    @staticmethod
    def _copy(source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        for s in (source, target):
            s.close()

    def close(self) -> None:
        self._listener.close()
        for s in self._sockets:
            s.close()


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise OSError("closed")
        data += chunk
    return data


@pytest.fixture
def gated_broker(tmp_path: Path) -> Any:
    """A broker of its own whose clients all go through a ProduceGate."""
    port = free_port()
    gate = ProduceGate(port)
    broker = KafkaBroker(tmp_path, port=port, advertised=gate.port)
    try:
        broker.start()
        yield broker, gate
    finally:
        broker.kill()  # memory storage, the test done: SIGTERM would wait 5 s on its clients
        gate.close()


def test_a_dead_letter_topic_refusing_writes_holds_the_partition_until_it_takes_them(
    gated_broker: tuple[KafkaBroker, ProduceGate], tmp_path: Path
) -> None:
    broker, gate = gated_broker
    topic, group = names()
    broker.create_topic(topic, partitions=1)
    produce_around(broker, topic, b"BAD")
    gate.shut.set()
    commit_every = ("--kafka-config", "auto.commit.interval.ms=1000")  # librdkafka's: 5 s
    proc = consume(broker, tmp_path, topic, group, "--dlq-timeout", "1s", *commit_every)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr or ()), daemon=True)
    reader.start()
    refusals = "neither handled nor dead-lettered"
    # Held, not crashed.
    wait_until(lambda: sum(refusals in line for line in lines) >= 3, "three refusals",
               timeout=120, procs=[proc], detail=lambda: "".join(lines))  # fmt: skip
    held = [line for line in lines if refusals in line]
    assert len(held) >= 3, "".join(lines)
    assert "pausing its partition there" in held[0] and "@2 " in held[0]
    waits = [float(line.split("trying again in ")[1].split("s")[0]) for line in held[:3]]
    assert waits == sorted(waits) and waits[2] > waits[0]  # back-off grows
    assert gate.cut > 0
    # A fourth refusal comes a --dlq-timeout (1 s) after the third: an auto-commit (every
    # 1 s) went by meanwhile, so what is committed now is what it stored.
    wait_until(lambda: sum(refusals in line for line in lines) >= 4, "a fourth refusal",
               timeout=120, procs=[proc], detail=lambda: "".join(lines))  # fmt: skip
    assert committed(broker, topic, group, 1) == {0: 2}  # nothing past the bad message
    assert ledger(tmp_path) == Counter({"good-0": 1, "good-1": 1})

    gate.shut.clear()  # the topic takes writes again
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        reader.join(10)
        raise AssertionError("".join(lines[-40:])) from None
    reader.join(10)
    assert proc.returncode == 0, "".join(lines)
    assert "Traceback" not in "".join(lines)
    assert ledger(tmp_path) == Counter(f"good-{i}" for i in range(4))
    dead = read_all(broker, f"{topic}.dlq", expect=1, timeout=60)
    assert [m.value() for m in dead] == [b"BAD"]
    assert committed(broker, topic, group, 1) == {0: 5}


def test_a_kafka_client_error_inside_the_loop_is_one_line_kafka_unavailable(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    from confluent_kafka import KafkaError, KafkaException

    from idemctl import open_store
    from idemctl.consume import Consumer, adapt
    from idemctl.errors import KafkaUnavailable
    from tests.consume.test_consume import options

    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    with open_store(f"sqlite:///{tmp_path}/keys.db") as store:
        consumer = Consumer(store, adapt(lambda event, ctx: None),
                            options(kafka_broker, topic, group))  # fmt: skip
        consumer.open()
        real = consumer._kafka

        class Failing:
            """The real client, but its fetch fails as a fatal librdkafka error would."""

            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

            def consume(self, **_: Any) -> list[Any]:
                raise KafkaException(KafkaError(KafkaError._FATAL, "the client is done for"))

        consumer._kafka = Failing()
        with pytest.raises(KafkaUnavailable, match=r"^the Kafka client failed: the client is done"):
            consumer.run()


def test_a_message_whose_partition_moved_while_its_handler_ran_is_dead_lettered_once(
    kafka_broker: KafkaBroker, redis_server: RedisServer
) -> None:
    """A handler that fails for good after a rebalance took its partition: the member that
    ran it writes no dead letter (the message is no longer its to finish, and the new owner
    gets it again); the new owner finds the key failed and writes the one letter, ``failed
    before`` (CI: two letters for one key under --processes). Two partitions, a key each,
    both handlers held until the second member has one: every key gets exactly one
    letter."""
    from idemctl import open_store
    from idemctl.consume import Consumer
    from idemctl.consume.event import Event
    from idemctl.runner import Context
    from tests.consume.test_consume import options
    from tests.consume.test_metrics import wait_until
    from tests.consume.test_stuck import _produce

    topic, group = names()
    kafka_broker.create_topic(topic, partitions=2)
    _produce(kafka_broker, topic, [(0, "k-0"), (1, "k-1")])
    go = threading.Event()
    ran: Counter[str] = Counter()

    def first(event: Event, ctx: Context) -> None:
        ran[f"first {ctx.key}"] += 1
        assert go.wait(120)
        raise ValueError(f"{ctx.key} fails for good")

    def second(event: Event, ctx: Context) -> None:
        ran[f"second {ctx.key}"] += 1

    with open_store(redis_server.url(query=f"prefix=moved-{topic}:")) as store:
        kw = dict(max_attempts=1, exit_when_idle=None, drain_timeout=0.5)
        a = Consumer(store, first, options(kafka_broker, topic, group, concurrency=2, **kw))
        b = Consumer(store, second, options(kafka_broker, topic, group, **kw))
        threads = [threading.Thread(target=c.run, daemon=True) for c in (a, b)]
        try:
            threads[0].start()
            # One message of each partition is in a handler of the first member, held.
            wait_until("both partitions' handlers running", lambda: len(ran) == 2)
            held = {k.split()[1] for k in ran}
            threads[1].start()
            shared = lambda: a.gauges().partitions == 1 == b.gauges().partitions  # noqa: E731
            wait_until("the partitions shared", shared)
            go.set()  # both fail for good now
            lettered = lambda: sum(c.summary.counts["dead_lettered"] for c in (a, b))  # noqa: E731
            wait_until("two dead letters", lambda: lettered() >= 2)
        finally:
            go.set()
            for c in (a, b):
                c.stop()
            for t in threads:
                t.join(60)
    letters = read_all(kafka_broker, f"{topic}.dlq", 2)
    said = {h["idempotency-key"]: h for h in
            ({k: v.decode() for k, v in m.headers() or ()} for m in letters)}  # fmt: skip
    assert len(letters) == 2 and set(said) == held, [m.headers() for m in letters]
    # The eager assignor revokes both partitions and gives one back: a message fetched
    # under the first assignment is fetched again under the second, and its letter is that
    # one's (``failed before``) whichever member owns it.
    assert all(h["idemctl-dlt-reason"] == "failed before" for h in said.values()), said
    assert all(f"ValueError: {k} fails for good" in h["kafka_dlt-exception-message"]
               for k, h in said.items())  # fmt: skip
    assert all(ran[f"first {k}"] == 1 and ran[f"second {k}"] == 0 for k in held)
    assert a.summary.counts["revoked"] == 2 and lettered() == 2
