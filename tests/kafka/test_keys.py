"""Key strategies and handler adaptation: pure logic, no broker."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from idemctl.consume import Event, adapt, load_handler
from idemctl.errors import ConfigError, InvalidKey, InvalidPayload
from idemctl.kafka.keys import Message, MissingKey, key_strategy
from idemctl.model import fingerprint


def msg(value: object = None, headers: list[tuple[str, bytes | None]] | None = None) -> Message:
    raw = value if isinstance(value, bytes) or value is None else json.dumps(value).encode()
    return Message("payments", 2, 41, raw, headers or [])


def test_header_strategy_reads_the_last_value_as_utf8() -> None:
    by_header = key_strategy("header:idempotency-key")
    assert (
        by_header(msg(headers=[("idempotency-key", b"a"), ("idempotency-key", "é".encode())]))
        == "é"
    )
    with pytest.raises(MissingKey, match="no 'idempotency-key' header"):
        by_header(msg(headers=[("other", b"x")]))
    # There but unusable: an invalid key (dead-lettered as such), not a missing one.
    for unusable, why in ((b"\xff", "not UTF-8"), (b"", "empty"), (b"a\x00b", "control")):
        with pytest.raises(InvalidKey, match=why) as refused:
            by_header(msg(headers=[("idempotency-key", unusable)]))
        assert not isinstance(refused.value, MissingKey)
    with pytest.raises(MissingKey):
        by_header(msg(headers=[("idempotency-key", None)]))


def test_template_strategy_joins_payload_fields() -> None:
    by_template = key_strategy("template:{tenant}:{txn.id}:{op}")
    assert by_template(msg({"tenant": "t1", "txn": {"id": 7}, "op": "charge"})) == "t1:7:charge"
    with pytest.raises(MissingKey, match="no field 'op'"):
        by_template(msg({"tenant": "t1", "txn": {"id": 7}}))
    with pytest.raises(MissingKey, match="not a scalar"):
        by_template(msg({"tenant": "t1", "txn": {"id": [1]}, "op": "x"}))
    with pytest.raises(InvalidPayload):
        by_template(msg(b"not json"))
    with pytest.raises(MissingKey, match="not a JSON object"):
        by_template(msg([1, 2]))


def test_payload_hash_and_offset_strategies() -> None:
    assert key_strategy("payload-hash")(msg({"b": 1, "a": 2})) == fingerprint({"a": 2, "b": 1})
    with pytest.raises(MissingKey):
        key_strategy("payload-hash")(msg(None))
    assert key_strategy("offset")(msg({"x": 1})) == "payments-2-41"


@pytest.mark.parametrize("spec", ["header:", "template:no-fields", "hash", "", "offsets"])
def test_unknown_strategies_name_the_forms(spec: str) -> None:
    with pytest.raises(ConfigError, match="header:NAME"):
        key_strategy(spec)


def event() -> Event:
    return Event("t", 0, 5, b"k", b'{"n": 3}', (("h", b"v"),), 1700000000000)


def test_adapt_calls_one_or_two_argument_and_async_handlers() -> None:
    ctx = object()
    assert adapt(lambda e: e.json()["n"])(event(), ctx) == 3  # type: ignore[arg-type]
    assert adapt(lambda e, c: c)(event(), ctx) is ctx  # type: ignore[arg-type]

    async def slow(e: Event) -> int:
        await asyncio.sleep(0)
        return e.offset

    assert adapt(slow)(event(), ctx) == 5  # type: ignore[arg-type]
    assert event().header("h") == b"v" and event().header("nope") is None


def test_load_handler_errors_are_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "myhandlers.py").write_text("def ok(event):\n    return 1\nvalue = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_handler("myhandlers:ok")(event(), object()) == 1  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not module:function"):
        load_handler("myhandlers")
    with pytest.raises(ConfigError, match="cannot import handler module 'nosuch'"):
        load_handler("nosuch:fn")
    with pytest.raises(ConfigError, match="has no 'missing'"):
        load_handler("myhandlers:missing")
    with pytest.raises(ConfigError, match="not callable"):
        load_handler("myhandlers:value")


def test_config_kafka_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from idemctl.config import load_config

    path = tmp_path / "idemctl.yaml"
    path.write_text(
        "kafka:\n  bootstrap.servers: a:9092\n  enable.idempotence: true\n"
        "profiles:\n  prod:\n    kafka:\n      bootstrap.servers: b:9093\n"
        "      sasl.password: ${KAFKA_PW}\n"
    )
    monkeypatch.setenv("KAFKA_PW", "s3cret")
    config = load_config(path)
    assert config.kafka_for(None) == {"bootstrap.servers": "a:9092", "enable.idempotence": "true"}
    assert config.kafka_for("prod") == {
        "bootstrap.servers": "b:9093", "enable.idempotence": "true", "sasl.password": "s3cret",
    }  # fmt: skip
    path.write_text("kafka: [a, b]\n")
    with pytest.raises(ConfigError, match="'kafka' must map librdkafka settings"):
        load_config(path)
