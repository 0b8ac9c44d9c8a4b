"""One bad message is a dead letter, never a stopped consumer: a key that cannot be used or a
payload that cannot be read goes to the dead-letter topic with its reason, its offset is
stored, and the consumer goes on with the next message, on every store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from idemctl import open_store
from tests.backends import FAMILIES, unique_prefix, unique_schema, unique_table
from tests.consume.test_consume import REPO, committed, kafka_flags, names, read_all
from tests.servers import KafkaBroker

BAD: dict[str, tuple[bytes | None, bytes, str]] = {
    # name: (idempotency-key header, payload, the dead letter's reason)
    "empty key": (b"", b'{"n": 1}', "invalid idempotency key"),
    "10 KB key": (b"k" * 10240, b'{"n": 2}', "invalid idempotency key"),
    "key not UTF-8": (b"order-\xff\xfe", b'{"n": 3}', "invalid idempotency key"),
    "NUL in key": (b"order\x00-4", b'{"n": 4}', "invalid idempotency key"),
    "unreadable payload": (b"order-nan", b'{"amount": NaN}', "unreadable payload"),
}


@pytest.fixture(params=FAMILIES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/keys.db"
    if request.param == "redis":
        return f"redis://127.0.0.1:{request.getfixturevalue('redis_server').port}/0?prefix={unique_prefix()}"
    if request.param == "postgres":
        url: str = request.getfixturevalue("postgres_server").url(schema=unique_schema())
    else:
        url = request.getfixturevalue("moto_server").url(unique_table())
    with open_store(url) as store:
        store.provision()
    return url


def test_bad_messages_are_dead_lettered_and_the_good_ones_run_once(
    kafka_broker: KafkaBroker, tmp_path: Path, store_url: str
) -> None:
    from confluent_kafka import Producer

    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    good = [f"good-{i}" for i in range(10)]
    for i, name in enumerate(BAD):  # a bad message between every two good ones
        for key in good[2 * i : 2 * i + 2]:
            producer.produce(topic, value=json.dumps({"k": key}).encode(),
                             headers=[("idempotency-key", key.encode())])  # fmt: skip
        header, payload, _ = BAD[name]
        producer.produce(topic, value=payload, headers=[("idempotency-key", header),
                                                        ("case", name.encode())])  # fmt: skip
    assert producer.flush(30) == 0
    total = len(good) + len(BAD)
    (tmp_path / "h.py").write_text(
        "import os\n"
        "def handle(event, ctx):\n"
        "    with open(os.environ['LEDGER'], 'a') as f:\n"
        "        f.write(ctx.key + '\\n')\n"
    )
    ledger = tmp_path / "ledger.txt"
    kafka = kafka_flags(kafka_broker)
    done = subprocess.run(
        [sys.executable, "-m", "idemctl", "--store", store_url, "--json", "consume",
         "--brokers", kafka_broker.bootstrap, "--topic", topic, "--group", group,
         "--handler", "h:handle", "--exit-when-idle", "3s", *kafka],
        cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False,
        env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}",
             "LEDGER": str(ledger)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert Counter(ledger.read_text().splitlines()) == Counter(good)  # each good one once
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["counts"]["dead_lettered"] == len(BAD)
    assert report["dead_letters"] == {"invalid idempotency key": 4, "unreadable payload": 1}
    dead = read_all(kafka_broker, f"{topic}.dlq", expect=len(BAD))
    reasons = {
        dict(m.headers())["case"].decode(): dict(m.headers())["idemctl-dlt-reason"].decode()
        for m in dead
    }
    assert reasons == {name: reason for name, (_, _, reason) in BAD.items()}
    assert committed(kafka_broker, topic, group, 1) == {0: total}


@pytest.mark.parametrize("choice", ["skip", "stop"])
def test_on_missing_key_skip_passes_a_bad_key_by_and_stop_stops_before_it(
    kafka_broker: KafkaBroker, tmp_path: Path, choice: str
) -> None:
    from idemctl.consume import ConsumeAborted, Consumer, adapt
    from tests.consume.test_consume import options, produce

    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, [{"value": {"n": 1}, "idem": "a"}, {"value": {"n": 2}, "idem": ""},
                                  {"value": {"n": 3}, "idem": "c"}])  # fmt: skip
    ran: list[str] = []
    with open_store(f"sqlite:///{tmp_path}/keys.db") as store:
        consumer = Consumer(
            store, adapt(lambda event, ctx: ran.append(ctx.key)),
            options(kafka_broker, topic, group, on_missing_key=choice),
        )  # fmt: skip
        if choice == "stop":
            with pytest.raises(ConsumeAborted, match="invalid idempotency key"):
                consumer.run()
            # Keys are read for the whole fetch before it runs: it stops before any of it.
            assert ran == []
            assert committed(kafka_broker, topic, group, 1) == {0: -1001}  # nothing past it
            return
        summary = consumer.run()
    assert ran == ["a", "c"]
    assert summary.counts["skipped"] == 1 and summary.counts["dead_lettered"] == 0
    assert committed(kafka_broker, topic, group, 1) == {0: 3}
