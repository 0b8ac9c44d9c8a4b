"""OpenTelemetry (the ``otel`` extra): consume's spans read back with the SDK's in-memory
exporter, against the real broker. The consumer runs in a process of its own, since a
process sets its tracer provider once."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from idemctl.tracing import key_attribute
from tests.consume.test_consume import produce, read_all
from tests.servers import KafkaBroker
from tests.traces import spans_of

TRACE = "0af7651916cd43dd8448eb211c80319c"
PRODUCER_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE}-{PRODUCER_SPAN}-01"

CONSUMER = r"""
from idemctl import Permanent, open_store
from idemctl.consume import ConsumeOptions, Consumer, adapt

brokers, topic, group, url, kafka = sys.argv[1:6]

def charge(event, ctx):
    with trace.get_tracer("payments").start_as_current_span("charge"):
        if event.json().get("poison"):
            raise Permanent("card refused")
        return {"charged": True}

options = ConsumeOptions(brokers, [topic], group, kafka_config=json.loads(kafka),
                         exit_when_idle=2.0, backoff=0.2)
with open_store(url) as store:
    Consumer(store, adapt(charge), options).run()
"""


def run_traced(broker: KafkaBroker, topic: str, group: str, url: str) -> list[dict[str, Any]]:
    kafka = {k: str(v) for k, v in broker.client_config().items() if k != "bootstrap.servers"}
    return spans_of(CONSUMER, broker.bootstrap, topic, group, url, json.dumps(kafka))


def test_spans_go_from_the_producer_through_claim_run_and_complete_to_the_dead_letter(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = f"traced-{os.getpid()}-{tmp_path.name}", f"g-{tmp_path.name}"
    kafka_broker.create_topic(topic, partitions=1)
    traced = {"kkey": b"1", "headers": [("traceparent", TRACEPARENT.encode())]}
    messages = [
        {"value": {"order": 1}, "idem": "pay-1", **traced},
        {"value": {"order": 1}, "idem": "pay-1", **traced},  # a duplicate: replayed
        {"value": {"order": 2, "poison": True}, "idem": "pay-2", **traced},
    ]
    produce(kafka_broker, topic, messages)
    spans = run_traced(kafka_broker, topic, group, f"sqlite:///{tmp_path}/traced.db")
    by_id = {s["id"]: s for s in spans}

    def children(span: dict[str, Any], name: str) -> list[dict[str, Any]]:
        return [s for s in spans if s["parent"] == span["id"] and s["name"] == name]

    process = [s for s in spans if s["name"] == "idemctl.process"]
    assert len(process) == 3
    for s in process:  # each continues the producer's trace, as its CONSUMER span
        assert (s["trace"], s["parent"], s["kind"]) == (TRACE, PRODUCER_SPAN, "CONSUMER")
        assert s["attributes"]["messaging.destination.name"] == topic
        assert s["attributes"]["idemctl.store"] == "sqlite"
    outcomes = sorted(s["attributes"]["idemctl.outcome"] for s in process)
    assert outcomes == ["dead_lettered", "executed", "replayed"]
    hashed = hashlib.sha256(b"pay-1").hexdigest()[:16]
    first = next(s for s in process if s["attributes"]["idemctl.outcome"] == "executed")
    assert first["attributes"]["idemctl.key"] == hashed  # hashed by default, never as is
    assert "pay-1" not in json.dumps(spans)

    # The first delivery: claimed (acquired), run, the handler's own span inside, completed.
    [claim] = children(first, "idemctl.claim")
    assert claim["attributes"]["idemctl.outcome"] == "acquired"
    assert claim["attributes"]["idemctl.attempt"] == 1
    token = claim["attributes"]["idemctl.fencing_token"]
    [run] = children(first, "idemctl.run")
    assert run["attributes"]["idemctl.outcome"] == "ran"
    assert run["attributes"]["idemctl.fencing_token"] == token
    [charge] = children(run, "charge")
    assert charge["trace"] == TRACE
    [complete] = children(first, "idemctl.complete")
    assert complete["attributes"]["idemctl.outcome"] == "executed"

    # The duplicate: its claim replays, nothing runs.
    replayed = next(s for s in process if s["attributes"]["idemctl.outcome"] == "replayed")
    assert [c["attributes"]["idemctl.outcome"] for c in children(replayed, "idemctl.claim")] == [
        "replayed"
    ]
    assert not children(replayed, "idemctl.run")

    # The poison: the handler's failure on its run span, then the dead letter, which carries
    # the trace on in its own traceparent.
    poison = next(s for s in process if s["attributes"]["idemctl.outcome"] == "dead_lettered")
    [failed] = children(poison, "idemctl.run")
    assert failed["status"] == "ERROR" and failed["attributes"]["idemctl.outcome"] == "error"
    [letter] = children(poison, "idemctl.dead_letter")
    assert letter["kind"] == "PRODUCER"
    assert letter["attributes"]["messaging.destination.name"] == f"{topic}.dlq"
    assert letter["attributes"]["idemctl.reason"] == "permanent failure"
    [dead] = read_all(kafka_broker, f"{topic}.dlq", 1)
    headers = dict(dead.headers())
    version, trace, parent, _flags = headers["traceparent"].decode().split("-")
    assert (version, trace, parent) == ("00", TRACE, letter["id"])
    assert all(s["parent"] in by_id or s["parent"] == PRODUCER_SPAN for s in spans)


def test_keys_on_spans_hashed_raw_or_left_out() -> None:
    assert key_attribute("pay-1", "raw") == {"idemctl.key": "pay-1"}
    assert key_attribute("pay-1", "none") == {}
    assert key_attribute("pay-1", "hash") == {
        "idemctl.key": hashlib.sha256(b"pay-1").hexdigest()[:16]
    }
