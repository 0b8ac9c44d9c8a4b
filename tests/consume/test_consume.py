"""idemctl consume against a real Kafka-protocol broker (tansu) and real stores: each key's
effect happens once, offsets move only past finished messages, bad messages are
dead-lettered with their origin, SIGTERM drains."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from idemctl import Acquired, Permanent, open_store
from idemctl.consume import ConsumeOptions, Consumer, Event, adapt
from idemctl.runner import Context
from tests.polling import wait_until
from tests.scrape import probe, scrape
from tests.servers import KafkaBroker

REPO = Path(__file__).resolve().parents[2]


def names() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:10]
    return f"t-{tag}", f"g-{tag}"


def produce(broker: KafkaBroker, topic: str, messages: list[dict[str, Any]]) -> None:
    """Each message: value (JSON-able or bytes), idem (the idempotency-key header or None),
    kkey (the Kafka key, which picks the partition), headers (more of them)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    for m in messages:
        value = m["value"] if isinstance(m["value"], bytes) else json.dumps(m["value"]).encode()
        headers = [] if m.get("idem") is None else [("idempotency-key", m["idem"].encode())]
        headers += m.get("headers", [])
        producer.produce(topic, value=value, key=m.get("kkey"), headers=headers)
    assert producer.flush(30) == 0


def read_all(broker: KafkaBroker, topic: str, expect: int, timeout: float = 30) -> list[Any]:
    from confluent_kafka import Consumer as KafkaConsumer

    c = KafkaConsumer(broker.client_config(**{"group.id": f"reader-{uuid.uuid4().hex}"}))
    c.subscribe([topic])
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expect and time.monotonic() < deadline:
            for m in c.consume(num_messages=500, timeout=0.5):
                if m.error() is None:
                    out.append(m)
        # anything beyond what was expected shows up in the assertion, not silently
        for m in c.consume(num_messages=500, timeout=1.0):
            if m.error() is None:
                out.append(m)
    finally:
        c.close()
    return out


def committed(broker: KafkaBroker, topic: str, group: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka import TopicPartition

    c = KafkaConsumer(broker.client_config(**{"group.id": group}))
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
    finally:
        c.close()
    return {tp.partition: tp.offset for tp in tps}


def kafka_flags(broker: KafkaBroker, **extra: Any) -> list[str]:
    """``--kafka-config k=v`` for each of the test broker's client settings but its address."""
    return [x for k, v in broker.client_config(**extra).items() if k != "bootstrap.servers"
            for x in ("--kafka-config", f"{k}={v}")]  # fmt: skip


def options(broker: KafkaBroker, topic: str, group: str, **kw: Any) -> ConsumeOptions:
    kafka = {k: str(v) for k, v in broker.client_config().items() if k != "bootstrap.servers"}
    kw.setdefault("exit_when_idle", 3.0)
    kw.setdefault("backoff", 0.2)
    return ConsumeOptions(broker.bootstrap, [topic], group, kafka_config=kafka, **kw)


def test_each_key_runs_once_across_duplicates_and_partitions(
    kafka_broker: KafkaBroker, store_url: str
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=3)
    keys = [f"order-{i}" for i in range(150)]
    messages = [{"value": {"order": k, "cents": 100}, "idem": k, "kkey": k.encode()} for k in keys]
    # 30% duplicates, half of them under another Kafka key, so in another partition.
    dupes = [
        {
            "value": {"order": k, "cents": 100},
            "idem": k,
            "kkey": (k + ("x" if i % 2 else "")).encode(),
        }
        for i, k in enumerate(keys[:45])
    ]
    produce(kafka_broker, topic, messages + dupes)
    effects: Counter[str] = Counter()
    lock = threading.Lock()

    def charge(event: Event, ctx: Context) -> dict[str, Any]:
        with lock:
            effects[event.json()["order"]] += 1
        assert ctx.key == event.json()["order"]
        return {"charged": event.json()["cents"]}

    with open_store(store_url) as store:
        summary = Consumer(
            store, adapt(charge), options(kafka_broker, topic, group, batch_size=50)
        ).run()
        assert store.get("order-7") is not None and store.get("order-7").result == {"charged": 100}  # type: ignore[union-attr]
    assert effects == Counter({k: 1 for k in keys})  # every key once: none lost, none twice
    assert summary.counts["executed"] == 150
    assert summary.counts["replayed"] == 45
    assert summary.counts["dead_lettered"] == 0
    ends = committed(kafka_broker, topic, group, 3)
    assert sum(ends.values()) == 195  # every message's offset committed, no more


def test_bad_messages_are_dead_lettered_with_their_origin(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, [
        {"value": {"n": 0}, "idem": "ok-0"},
        {"value": {"n": 1}, "idem": None},  # no key header
        {"value": {"n": 2, "poison": True}, "idem": "poison-2"},  # the handler refuses it
        {"value": {"n": 3, "flaky": True}, "idem": "flaky-3"},  # fails once, then works
        {"value": {"n": 4, "broken": True}, "idem": "broken-4"},  # always fails: retries end
        {"value": {"n": 5}, "idem": "ok-0"},  # the key of message 0 with another payload
        {"value": {"n": 6}, "idem": "ok-6"},
    ])  # fmt: skip
    runs: Counter[int] = Counter()

    def handler(event: Event) -> int:
        body = event.json()
        runs[body["n"]] += 1
        if body.get("poison"):
            raise Permanent("card number is invalid")
        if body.get("broken") or (body.get("flaky") and runs[body["n"]] == 1):
            raise RuntimeError("payment service timed out")
        return int(body["n"])

    with open_store(f"sqlite:///{tmp_path}/keys.db") as store:
        summary = Consumer(
            store, adapt(handler), options(kafka_broker, topic, group, max_attempts=3)
        ).run()
    assert runs == Counter({0: 1, 2: 1, 3: 2, 4: 3, 6: 1})
    assert summary.counts["executed"] == 3  # 0, 3 (second attempt), 6
    assert summary.counts["dead_lettered"] == 4  # 1, 2, 4, 5
    dead = read_all(kafka_broker, f"{topic}.dlq", expect=4)
    by_offset = {
        int.from_bytes(dict(m.headers())["kafka_dlt-original-offset"], "big"): m for m in dead
    }
    assert sorted(by_offset) == [1, 2, 4, 5]
    for offset, m in by_offset.items():
        headers = dict(m.headers())
        assert headers["kafka_dlt-original-topic"] == topic.encode()
        assert int.from_bytes(headers["kafka_dlt-original-partition"], "big") == 0
        assert headers["kafka_dlt-original-consumer-group"] == group.encode()
        assert json.loads(m.value())["n"] == offset  # the original payload, untouched
    reasons = {o: dict(m.headers())["idemctl-dlt-reason"].decode() for o, m in by_offset.items()}
    assert reasons == {
        1: "no idempotency key", 2: "permanent failure", 4: "failed 3 times",
        5: "fingerprint mismatch",
    }  # fmt: skip
    assert b"card number is invalid" in dict(by_offset[2].headers())["kafka_dlt-exception-message"]
    assert committed(kafka_broker, topic, group, 1) == {0: 7}


def test_a_busy_key_holds_its_partition_until_the_holder_finishes(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, [{"value": {"n": i}, "idem": f"k-{i}"} for i in range(3)])
    url = f"sqlite:///{tmp_path}/keys.db"
    seen: list[int] = []
    with open_store(url) as other, open_store(url) as store:
        held = other.claim("k-1", lease=30)  # another worker holds k-1
        assert isinstance(held, Acquired)
        consumer = Consumer(
            store, adapt(lambda e: seen.append(e.json()["n"])), options(kafka_broker, topic, group)
        )

        def finish_once_it_waits() -> None:
            try:
                wait_until(lambda: consumer.summary.counts["busy"], "the consumer finds k-1 busy")
            finally:
                other.complete("k-1", held.owner, held.fencing_token, "done elsewhere")

        threading.Thread(target=finish_once_it_waits, daemon=True).start()
        summary = consumer.run()
    assert seen == [0, 2]  # k-1 ran elsewhere; k-2 waited behind it, in order
    assert summary.counts["busy"] >= 1 and summary.counts["replayed"] == 1
    assert committed(kafka_broker, topic, group, 1) == {0: 3}


def test_cli_consume_runs_a_handler_module_and_sigterm_drains(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    # The third handler runs until the test releases it, after SIGTERM was heard: mid-handler.
    (tmp_path / "slow.py").write_text(
        "import os\n"
        "from tests.polling import wait_until\n"
        "def handle(event, ctx):\n"
        "    with open('effects.txt', 'a') as f:\n"
        "        f.write(ctx.key + ' start\\n')\n"
        "    with open('effects.txt') as f:\n"
        "        if f.read().count('start') >= 3:\n"
        "            wait_until(lambda: os.path.exists('release'), 'the test releases it', 120)\n"
        "    with open('effects.txt', 'a') as f:\n"
        "        f.write(ctx.key + ' done\\n')\n"
        "    return ctx.attempt\n"
    )
    produce(kafka_broker, topic, [{"value": {"n": i}, "idem": f"s-{i}"} for i in range(20)])
    from tests.servers import free_port

    metrics_port = free_port()
    kafka = kafka_flags(kafka_broker)
    errors = tmp_path / "stderr.txt"
    stderr = errors.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "idemctl", "--store", f"sqlite:///{tmp_path}/keys.db", "consume",
         "--brokers", kafka_broker.bootstrap, "--topic", topic, "--group", group,
         "--handler", "slow:handle", "--batch-size", "1", "--json", *kafka,
         "--metrics-port", str(metrics_port), "--metrics-host", "127.0.0.1"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=stderr, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    try:
        effects = tmp_path / "effects.txt"
        wait_until(lambda: effects.exists() and effects.read_text().count("start") >= 3,
                   "three handlers started", procs=[proc], detail=errors.read_text)  # fmt: skip
        samples, types = scrape(metrics_port)
        assert samples[("idemctl_messages_total", (("outcome", "executed"),))] >= 2
        assert types["idemctl_paused_partitions"] == "gauge"
        assert probe(metrics_port, "/healthz")[0] == 200
        assert probe(metrics_port, "/readyz") == (200, "ready\n")
        proc.send_signal(signal.SIGTERM)  # mid-handler: the third is held until it is heard
        wait_until(lambda: "SIGTERM: finishing the work in hand" in errors.read_text(),
                   "SIGTERM heard", procs=[proc], detail=errors.read_text)  # fmt: skip
        (tmp_path / "release").touch()
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        stderr.close()
    err = errors.read_text()
    assert proc.returncode == 0, err
    lines = effects.read_text().splitlines()
    started = [ln.split()[0] for ln in lines if ln.endswith("start")]
    finished = [ln.split()[0] for ln in lines if ln.endswith("done")]
    assert started == finished  # the handler in hand finished; none was cut off
    report = json.loads(out)
    assert report["counts"]["executed"] == len(finished)
    assert committed(kafka_broker, topic, group, 1) == {0: len(finished)}  # all, and only, those


def test_cli_consume_bad_handler_and_unreachable_store(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    from tests.servers import free_port

    base = [sys.executable, "-m", "idemctl"]
    common = ["consume", "--brokers", kafka_broker.bootstrap, "--topic", "x", "--group", "g"]
    bad = subprocess.run(
        [*base, "--store", f"sqlite:///{tmp_path}/k.db", *common, "--handler", "nosuchmodule:fn"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "cannot import handler module 'nosuchmodule'" in bad.stderr
    (tmp_path / "h.py").write_text("def fn(event):\n    return 1\n")
    down = subprocess.run(
        [*base, "--store", f"redis://:pw-secret@127.0.0.1:{free_port()}/0?socket_connect_timeout=1s",
         *common, "--handler", "h:fn", "--max-messages", "1", "--exit-when-idle", "2s"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert down.returncode == 3, down.stderr  # fails fast, before reading anything
    assert "unreachable" in down.stderr and "pw-secret" not in down.stdout + down.stderr


def test_store_outage_fails_closed_and_loses_nothing(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """Redis stopped mid-run and started again (its AOF keeps the completed keys): nothing
    is committed past what was finished, nothing is lost, nothing runs twice."""
    from tests.servers import RedisServer

    topic, group = names()
    kafka_broker.create_topic(topic, partitions=2)
    produce(kafka_broker, topic, [{"value": {"n": i}, "idem": f"o-{i}", "kkey": str(i).encode()}
                                  for i in range(400)])  # fmt: skip
    server = RedisServer(tmp_path, "--appendonly", "yes", "--appendfsync", "always")
    effects: Counter[str] = Counter()
    outage = threading.Event()

    def handler(event: Event, ctx: Context) -> None:
        effects[ctx.key] += 1
        if sum(effects.values()) == 100 and not outage.is_set():
            outage.set()
            server.stop()  # between this key's run and its completion
        time.sleep(0.002)

    try:
        server.start()
        url = f"redis://127.0.0.1:{server.port}/0?socket_timeout=1s&socket_connect_timeout=1s"
        with open_store(url) as store:
            # A short lease: the key whose completion the outage cut off is Busy until then.
            consumer = Consumer(
                store, adapt(handler), options(kafka_broker, topic, group, batch_size=20, lease=3.0)
            )
            worker = threading.Thread(target=consumer.run, daemon=True)
            worker.start()
            assert outage.wait(60)
            # the consumer meets the outage (and commits nothing past it meanwhile)
            wait_until(lambda: consumer.summary.counts["store_unavailable"], "store unavailable")
            during = committed(kafka_broker, topic, group, 2)
            assert sum(o for o in during.values() if o > 0) < 100  # nothing past the outage
            assert consumer.summary.counts["store_unavailable"] >= 1
            server.start()
            worker.join(120)
            assert not worker.is_alive()
    finally:
        server.stop()
    assert set(effects) == {f"o-{i}" for i in range(400)}  # none lost
    # The key whose completion the outage cut off may run again (its lease ran out); no other.
    assert sum(effects.values()) - 400 <= 20
    assert sum(committed(kafka_broker, topic, group, 2).values()) == 400


def test_a_consumer_joining_and_leaving_loses_nothing(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """A second member joins mid-run (a rebalance hands it half the partitions) and leaves
    again (they come back): every key runs once, every offset is committed."""
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=4)
    produce(kafka_broker, topic, [{"value": {"n": i}, "idem": f"r-{i}", "kkey": str(i).encode()}
                                  for i in range(600)])  # fmt: skip
    url = f"sqlite:///{tmp_path}/keys.db"
    effects: Counter[str] = Counter()
    lock = threading.Lock()

    def handler(event: Event, ctx: Context) -> None:
        with lock:
            effects[ctx.key] += 1
        time.sleep(0.03)  # slow enough for the second member to get work

    with open_store(url) as first_store, open_store(url) as second_store:
        # Idle through a rebalance is not done: wait longer than a group join takes.
        opts = options(kafka_broker, topic, group, batch_size=10, exit_when_idle=10.0)
        first = Consumer(first_store, adapt(handler), opts)
        second = Consumer(second_store, adapt(handler), opts)
        one = threading.Thread(target=first.run, daemon=True)
        one.start()
        wait_until(lambda: sum(effects.values()) >= 100, "the first member ran 100 keys")
        two = threading.Thread(target=second.run, daemon=True)
        two.start()
        # It got partitions and worked them.
        wait_until(lambda: second.summary.finished >= 50, "the second member got work")
        second.stop()  # leaves: its partitions go back to the first
        two.join(60)
        one.join(120)
        assert not one.is_alive() and not two.is_alive()
    assert set(effects) == {f"r-{i}" for i in range(600)}
    assert [k for k, n in effects.items() if n > 1] == []  # handed over without a rerun
    assert sum(committed(kafka_broker, topic, group, 4).values()) == 600


def test_cli_consume_takes_kafka_settings_from_idemctl_yaml(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, [{"value": {"n": i}, "idem": f"y-{i}"} for i in range(5)])
    settings = "\n".join(f"    {k}: {v}" for k, v in kafka_broker.client_config().items())
    (tmp_path / "idemctl.yaml").write_text(
        f"store: sqlite:///{tmp_path}/keys.db\n"
        "kafka:\n  bootstrap.servers: 127.0.0.1:1\n"  # the profile's wins
        f"profiles:\n  local:\n    kafka:\n{settings.replace('    ', '      ')}\n"
    )
    (tmp_path / "h.py").write_text("def fn(event):\n    return event.offset\n")
    result = subprocess.run(
        [sys.executable, "-m", "idemctl", "--profile", "local", "--json", "consume",
         "--topic", topic, "--group", group, "--handler", "h:fn", "--exit-when-idle", "2s"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["counts"] == {"executed": 5}
    assert committed(kafka_broker, topic, group, 1) == {0: 5}


def test_concurrency_runs_partitions_side_by_side_each_in_order(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=3)
    produce(kafka_broker, topic, [{"value": {"n": i}, "idem": f"c-{i}", "kkey": str(i).encode()}
                                  for i in range(90)])  # fmt: skip
    lock = threading.Lock()
    running, most = 0, 0
    order: dict[int, list[int]] = {}
    overlapped = threading.Event()

    def handler(event: Event) -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
            order.setdefault(event.partition, []).append(event.offset)
            if running >= 2:
                overlapped.set()
        # A handler waiting on I/O: until another partition's handler runs beside it (a
        # consumer running one at a time never gets there, and most stays 1).
        overlapped.wait(60)
        with lock:
            running -= 1

    with open_store(f"sqlite:///{tmp_path}/keys.db") as store:
        summary = Consumer(
            store, adapt(handler), options(kafka_broker, topic, group, concurrency=3)
        ).run()
    assert summary.counts["executed"] == 90
    assert most >= 2  # handlers of different partitions overlapped
    assert all(offsets == sorted(offsets) for offsets in order.values())  # each in order
    assert sum(len(o) for o in order.values()) == 90
    assert sum(committed(kafka_broker, topic, group, 3).values()) == 90


def test_wrong_brokers_stop_the_consumer_after_the_join_timeout(tmp_path: Path) -> None:
    from idemctl.errors import KafkaUnavailable
    from tests.servers import free_port

    port = free_port()  # nothing listens there
    with open_store(f"sqlite:///{tmp_path}/keys.db") as store:
        consumer = Consumer(
            store, adapt(lambda e: None),
            ConsumeOptions(f"127.0.0.1:{port}", ["nowhere"], "g", join_timeout=2.0,
                           exit_when_idle=1.0),
        )  # fmt: skip
        started = time.monotonic()
        with pytest.raises(KafkaUnavailable) as stopped:
            consumer.run()
    assert time.monotonic() - started < 20
    message = str(stopped.value)
    assert f"127.0.0.1:{port}" in message and "nowhere" in message
    assert "no partitions within 2s" in message
    with open_store(f"sqlite:///{tmp_path}/keys.db") as store:
        assert store.stats().total == 0  # nothing claimed


@pytest.mark.parametrize("replacement", [False, True])
def test_a_replacement_worker_waits_for_its_group_past_the_join_timeout(
    replacement: bool, tmp_path: Path
) -> None:
    """The first join is judged by --join-timeout; a worker of --processes that replaces one
    that died waits however long its group's rebalance takes (the brokers were proven)."""
    from idemctl.errors import KafkaUnavailable

    with open_store(f"sqlite:///{tmp_path}/keys.db") as store:
        consumer = Consumer(
            store, adapt(lambda e: None),
            ConsumeOptions("127.0.0.1:1", ["t"], "g", join_timeout=60.0, replacement=replacement),
        )  # fmt: skip
        long_ago = time.monotonic() - 3600  # started an hour ago, no partition since
        if replacement:
            assert consumer._watch(long_ago) is False
        else:
            with pytest.raises(KafkaUnavailable, match="no partitions within 3600s"):
                consumer._watch(long_ago)
