"""``idemctl audit`` on a setup it cannot judge fails loudly instead of saying "ok": a group
that committed nothing on the topic, a ``--key`` that finds no key in most messages, a
store (or prefix) that holds none of the audited keys, a ``--since`` outside what Kafka's
timestamps can mean. Real broker, real stores, the CLI as a user runs it, text and --json."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from idemctl import Acquired, open_store
from idemctl.audit import AuditReport, PartitionAudit
from tests.audit.test_audit import commit, consume, produce
from tests.backends import unique_prefix
from tests.cli.helpers import json_doc, messages, on
from tests.consume.test_consume import committed, kafka_flags, names
from tests.servers import KafkaBroker


def audit_args(broker: KafkaBroker, topic: str, group: str, *more: str) -> list[str]:
    return ["audit", "--brokers", broker.bootstrap, *kafka_flags(broker), "--topic", topic,
            "--group", group, *more]  # fmt: skip


def provisioned(url: str) -> str:
    with open_store(url) as store:
        store.provision()
    return url


def test_a_group_that_committed_nothing_on_the_topic_is_a_usage_error(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    url = provisioned(f"sqlite:///{tmp_path}/keys.db")
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=2)
    produce(kafka_broker, topic, [
        {"value": {"n": i}, "idem": f"k-{i}", "partition": i % 2} for i in range(10)
    ])  # fmt: skip

    for extra in ([], ["--json"]):
        misspelt = on(url, *audit_args(kafka_broker, topic, f"{group}-typo", *extra))
        assert misspelt.exit_code == 2, misspelt.output
        assert misspelt.stdout == ""
        (line,) = messages(misspelt).splitlines()
        assert line.startswith(f"error: group {group}-typo has committed nothing on {topic}")
        assert "kafka-consumer-groups" in line

    # committed on partition 0 only: that one is judged, and partition 1 is named
    with open_store(url) as store:
        for i in range(0, 10, 2):
            claim = store.claim(f"k-{i}")
            assert isinstance(claim, Acquired)
            store.complete(claim.key, claim.owner, claim.fencing_token, i)
    commit(kafka_broker, topic, group, {0: 5})
    assert committed(kafka_broker, topic, group, 2) == {0: 5, 1: -1001}
    text = on(url, *audit_args(kafka_broker, topic, group))
    assert text.exit_code == 0, text.output
    assert "ok: nothing lost among 5 message(s) audited" in text.stderr
    assert f"no commit on {topic}[1]" in text.stderr
    doc = json_doc(on(url, *audit_args(kafka_broker, topic, group), "--json"), "audit.schema.json")
    assert (doc["ok"], doc["done"], doc["pending"]) == (True, 5, 5)
    assert [p["committed"] for p in doc["partitions"]] == [5, None]


def test_most_messages_without_a_key_under_the_key_template_fail_the_audit(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    url = provisioned(f"sqlite:///{tmp_path}/keys.db")
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, [{"value": {"order_id": i}, "idem": None} for i in range(30)])
    template = "template:{order_id}"
    summary = consume(kafka_broker, url, topic, group, lambda e: 1, key=template)
    assert summary.counts["executed"] == 30
    assert committed(kafka_broker, topic, group, 1) == {0: 30}

    # audited with the default template (the header), none of them has a key
    text = on(url, *audit_args(kafka_broker, topic, group))
    assert text.exit_code == 1, text.output
    assert "30 of 30 message(s) audited have no usable key" in text.stderr
    assert "--key 'header:idempotency-key'" in text.stderr
    assert "the --key template the group's consumer runs with" in text.stderr
    assert "ok:" not in text.stderr
    doc = json_doc(on(url, *audit_args(kafka_broker, topic, group), "--json"), "audit.schema.json")
    assert (doc["ok"], doc["dead_lettered"], doc["unkeyed"]) == (False, 30, 30)
    ((cause, hint),) = [(d["cause"], d["hint"]) for d in doc["doubts"]]
    assert cause == "key" and "--key 'header:idempotency-key'" in hint

    # with the consumer's own template everything is judged, and done
    right = on(url, *audit_args(kafka_broker, topic, group, "--key", template), "--json")
    assert right.exit_code == 0, right.output
    doc = json_doc(right, "audit.schema.json")
    assert (doc["ok"], doc["done"], doc["unkeyed"], doc["doubts"]) == (True, 30, 0, [])


def test_keys_none_of_which_are_in_the_store_blame_the_store_not_the_group(
    kafka_broker: KafkaBroker, redis_server: Any
) -> None:
    base = f"redis://127.0.0.1:{redis_server.port}/0"
    written = provisioned(f"{base}?prefix={unique_prefix()}")
    other = provisioned(f"{base}?prefix={unique_prefix()}")
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, [{"value": {"n": i}, "idem": f"k-{i}"} for i in range(30)])
    summary = consume(kafka_broker, written, topic, group, lambda e: 1)
    assert summary.counts["executed"] == 30

    assert on(written, *audit_args(kafka_broker, topic, group)).exit_code == 0
    text = on(other, *audit_args(kafka_broker, topic, group))
    assert text.exit_code == 1, text.output
    assert "none of the 30 message(s) audited with a key has a record in this store" in text.stderr
    assert "the store or its prefix" in text.stderr and "--key" in text.stderr
    assert "FAILED: 30 lost" not in text.stderr
    result = on(other, *audit_args(kafka_broker, topic, group), "--json")
    assert result.exit_code == 1
    doc = json_doc(result, "audit.schema.json")
    assert (doc["ok"], doc["lost"], doc["found"]) == (False, 30, 0)
    ((cause, hint),) = [(d["cause"], d["hint"]) for d in doc["doubts"]]
    assert cause == "store" and "prefix" in hint


def test_since_before_the_epoch_or_after_now_is_a_usage_error_before_anything_is_read(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    url = provisioned(f"sqlite:///{tmp_path}/keys.db")
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, [{"value": {"n": i}, "idem": f"k-{i}"} for i in range(10)])
    commit(kafka_broker, topic, group, {0: 10})
    future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    nowhere = f"sqlite:///{tmp_path}/absent.db"  # not provisioned: opening it would be exit 4

    for since in ("1969-12-31T23:59:59.999", "0001-01-01", future):
        for extra in ([], ["--json"]):
            result = on(url, *audit_args(kafka_broker, topic, group, "--since", since, *extra))
            assert result.exit_code == 2, (since, result.output)
            assert result.stdout == ""
            (line,) = result.stderr.splitlines()  # not even the store line: nothing opened
            assert line.startswith("error: --since ") and since[:10] in line, line
        # neither the store nor the brokers are touched: an absent store and closed port
        untouched = on(nowhere, "audit", "--brokers", "127.0.0.1:1", "--topic", topic,
                       "--group", group, "--since", since)  # fmt: skip
        assert untouched.exit_code == 2, (since, untouched.output)
        assert untouched.stderr.startswith("error: --since ")
    assert not Path(f"{tmp_path}/absent.db").exists()


def report(**counts: int) -> AuditReport:
    """A one-partition report with these counts (and ``unkeyed``, ``found``, ``absent``)."""
    extra = {k: counts.pop(k) for k in ("unkeyed", "found", "absent") if k in counts}
    part = PartitionAudit(0, 100, 0, 100)
    part.counts.update(counts)
    return AuditReport("t", "g", "sqlite:///x", [part], **extra)


def test_more_than_half_unkeyed_is_doubted_and_half_is_not() -> None:
    half = report(done=5, dead_lettered=5, unkeyed=5, found=5)
    assert half.doubts() == []
    most = report(done=4, dead_lettered=6, unkeyed=6, found=4)
    assert [d.cause for d in most.doubts()] == ["key"]
    # none found, but none judged absent either (all beyond retention): not doubted
    assert report(beyond_retention=10).doubts() == []
    assert [d.cause for d in report(lost=3, absent=3).doubts()] == ["store"]
    assert report().doubts() == []
