"""``idemctl audit`` as a user runs it: the table, --json (checked against its schema),
the exit codes, and the options it refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from idemctl import open_store
from idemctl.consume import Consumer, Event, adapt
from tests.cli.helpers import json_doc, on
from tests.consume.test_consume import committed, kafka_flags, names, options, produce
from tests.servers import KafkaBroker


def commit(broker: KafkaBroker, topic: str, group: str, offset: int) -> None:
    """Another member of ``group`` commits ``offset`` on partition 0, as a buggy one would."""
    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka import TopicPartition

    c = KafkaConsumer(broker.client_config(**{"group.id": group, "enable.auto.commit": False}))
    try:
        c.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        c.close()


def keyed(n: int, prefix: str) -> list[dict[str, Any]]:
    return [{"value": {"n": i}, "idem": f"{prefix}-{i}"} for i in range(n)]


def send(broker: KafkaBroker, topic: str, messages: list[dict[str, Any]]) -> None:
    """``messages``, the last in a batch of its own: tansu's high watermark counts batches,
    not messages, and is right only where the last batch holds one (Kafka's always is)."""
    produce(broker, topic, messages[:-1])
    produce(broker, topic, messages[-1:])


def audit_args(broker: KafkaBroker, topic: str, group: str, *more: str) -> list[str]:
    return ["audit", "--brokers", broker.bootstrap, *kafka_flags(broker), "--topic", topic,
            "--group", group, *more]  # fmt: skip


def test_audit_names_what_a_group_committed_past_and_exits_1(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/keys.db"
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    send(kafka_broker, topic, keyed(100, "pay"))
    with open_store(url) as store:
        Consumer(store, adapt(lambda e: None), options(kafka_broker, topic, group,
                 max_messages=60)).run()  # fmt: skip
    assert committed(kafka_broker, topic, group, 1) == {0: 60}
    commit(kafka_broker, topic, group, 80)  # 60..79 passed without being run

    result = on(url, *audit_args(kafka_broker, topic, group), "--json")
    assert result.exit_code == 1, result.stderr
    doc = json_doc(result, "audit.schema.json")
    assert (doc["ok"], doc["failing"]) == (False, ["lost"])
    assert (doc["audited"], doc["done"], doc["lost"], doc["pending"]) == (80, 60, 20, 20)
    assert doc["lost_keys"][0] == {
        "partition": 0, "offset": 60, "key": "pay-60",
        "why": "its key has no record: never claimed, or forgotten",
    }  # fmt: skip
    assert [k["offset"] for k in doc["lost_keys"]] == list(range(60, 80))
    assert doc["partitions"][0]["committed"] == 80 and doc["partitions"][0]["start"] == 0

    text = on(url, *audit_args(kafka_broker, topic, group), "--last", "30")
    assert text.exit_code == 1
    assert "FAILED: 20 lost of 30 message(s) audited" in text.stderr
    assert f"{topic}[0]@60  pay-60: its key has no record" in text.stdout
    assert committed(kafka_broker, topic, group, 1) == {0: 80}  # audit commits nothing

    widened = on(url, *audit_args(kafka_broker, topic, group), "--since", "1h", "--json",
                 "--fail-on", "pending")  # fmt: skip
    assert widened.exit_code == 1
    assert json_doc(widened, "audit.schema.json")["failing"] == ["pending"]


def test_a_clean_run_audits_ok_and_bad_options_are_usage_errors(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/keys.db"
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=2)
    send(kafka_broker, topic, [*keyed(100, "ok"), {"value": {"n": -1}, "idem": None}])
    seen: list[Event] = []
    with open_store(url) as store:
        Consumer(store, adapt(seen.append), options(kafka_broker, topic, group)).run()
    assert len(seen) == 100

    result = on(url, *audit_args(kafka_broker, topic, group))
    assert result.exit_code == 0, result.stderr
    assert "ok: nothing lost among 101 message(s) audited" in result.stderr
    doc = json_doc(on(url, *audit_args(kafka_broker, topic, group), "--json"), "audit.schema.json")
    assert (doc["done"], doc["dead_lettered"], doc["lost"], doc["pending"]) == (100, 1, 0, 0)

    for bad, says in [
        (["--fail-on", "lost,nonsense"], "--fail-on 'lost,nonsense': use one or more of"),
        (["--since", "yesterday"], "--since"),
        (["--key", "nope"], "unknown key strategy 'nope'"),
        (["--order-key", "account:{a}"], "--order-key and --sequence go together"),
    ]:
        refused = on(url, *audit_args(kafka_broker, topic, group), *bad)
        assert refused.exit_code == 2, (bad, refused.stderr)
        assert says in refused.stderr, (bad, refused.stderr)
    memory = on("memory://", *audit_args(kafka_broker, topic, group))
    assert memory.exit_code == 2 and "memory:// store lives in one process" in memory.stderr
    unknown = on(url, *audit_args(kafka_broker, "no-such-topic", group))
    assert unknown.exit_code in (2, 7), unknown.stderr
    assert "no-such-topic" in unknown.stderr
