"""A partition idemctl pauses survives a rebalance, and a stall behind idemctl's back is
found and recovered (real broker; SQLite and Redis).

librdkafka keeps a partition paused across a revoke and a new assignment. Before the fix, a
consumer that paused its partition (a busy key, say) while a second member joined and left
never fetched it again: 0 of 20 messages ran, with every health signal green."""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from idemctl import Acquired, open_store
from idemctl.consume import Consumer, Event, adapt
from idemctl.consume.metrics import register
from idemctl.errors import StoreUnavailable
from idemctl.runner import Context
from idemctl.stores.base import Store
from tests.backends import unique_prefix
from tests.consume.test_consume import committed, names, options, produce
from tests.consume.test_dead_letters import ProduceGate, gated_broker  # noqa: F401
from tests.consume.test_ordering import ORDER
from tests.polling import wait_until
from tests.servers import KafkaBroker

MESSAGES = 20
HOLDS = ["busy", "store_unavailable", "gap_wait", "dead_letter_refused"]


class Flaky:
    """The store, except that while ``down`` is set its claims fail as an unreachable
    store's do: the consumer's store_unavailable hold (fail closed)."""

    def __init__(self, store: Store) -> None:
        self.store, self.down = store, threading.Event()

    def claim_many(self, *args: Any, **kwargs: Any) -> Any:
        if self.down.is_set():
            raise StoreUnavailable("the test's store is down")
        return self.store.claim_many(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


@pytest.fixture(params=["sqlite", "redis"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/keys.db"
    server = request.getfixturevalue("redis_server")
    return f"redis://127.0.0.1:{server.port}/0?prefix={unique_prefix()}"


def messages(hold: str) -> list[dict[str, Any]]:
    if hold == "gap_wait":  # one account's events 2..21: sequence 1 never comes
        return [
            {"value": {"account": 1, "seq": s, "n": s}, "idem": f"ev-{s}", "kkey": b"a"}
            for s in range(2, MESSAGES + 2)
        ]
    first = {"value": "not JSON", "idem": None} if hold == "dead_letter_refused" else None
    rest = [{"value": {"n": i}, "idem": f"k-{i}"} for i in range(MESSAGES)]
    return [first, *rest[1:]] if first else rest


def cause(hold: str, url: str, store: Flaky, gate: ProduceGate | None) -> Callable[[], None]:
    """Make the hold's cause; returns what ends it."""
    if hold == "busy":
        other = open_store(url)
        held = other.claim("k-0", lease=60)  # another worker holds the first key
        assert isinstance(held, Acquired)

        def done() -> None:
            other.complete("k-0", held.owner, held.fencing_token, "done elsewhere")
            other.close()

        return done
    if hold == "store_unavailable":
        store.down.set()
        return store.down.clear
    if hold == "dead_letter_refused":
        assert gate is not None
        gate.shut.set()  # the dead-letter topic takes no writes
        return gate.shut.clear
    return lambda: None  # gap_wait: --gap-timeout ends it


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """``condition`` within ``timeout`` (tests/polling.py's, in this file's order)."""
    wait_until(condition, what, timeout)


@pytest.mark.parametrize("hold", HOLDS)
def test_a_held_partition_runs_again_after_a_member_joins_and_leaves(
    hold: str, url: str, request: pytest.FixtureRequest
) -> None:
    gate = None
    if hold == "dead_letter_refused":
        broker, gate = request.getfixturevalue("gated_broker")
    else:
        broker = request.getfixturevalue("kafka_broker")
    topic, group = names()
    broker.create_topic(topic, partitions=1)
    produce(broker, topic, messages(hold))
    ran: Counter[str] = Counter()

    def handler(event: Event, ctx: Context) -> None:
        ran[ctx.key] += 1

    extra: dict[str, Any] = {"contiguous": True, "gap_timeout": 12.0, **ORDER}
    more = extra if hold == "gap_wait" else {}
    with open_store(url) as first_store, open_store(url) as second_store:
        flaky = Flaky(first_store)
        end = cause(hold, url, flaky, gate)

        def member(store: Any, client: str) -> Consumer:
            # The range assignor gives the lone partition to the member whose id sorts first:
            # the first member keeps it through both rebalances (revoked, then assigned again).
            opts = options(broker, topic, group, exit_when_idle=None, backoff=0.3, **more)
            opts.kafka_config["client.id"] = client
            # on_progress: the summary keeps its state ("no partitions assigned") up to date.
            return Consumer(store, adapt(handler), opts, on_progress=lambda summary: None)

        first = member(flaky, "a-first")
        one = threading.Thread(target=first.run, daemon=True)
        one.start()
        wait_for(
            lambda: first.summary.counts[hold] >= 1, 60, f"the first member never held: {hold}"
        )
        second = member(second_store, "z-second")
        two = threading.Thread(target=second.run, daemon=True)
        two.start()  # joins: the first member's partition is revoked and assigned again
        wait_for(lambda: second.summary.state == "no partitions assigned", 60, "no rebalance")
        second.stop()  # leaves: revoked and assigned again, once more
        two.join(60)
        assert not two.is_alive()
        end()
        expected = {m["idem"] for m in messages(hold) if m["idem"]}
        if hold == "busy":
            expected.discard("k-0")  # completed by the other worker: replayed, not run
        wait_for(lambda: set(ran) >= expected, 90, f"ran {sorted(ran)}, held for good")
        first.stop()
        one.join(60)
    assert set(ran) == expected and max(ran.values()) == 1
    assert committed(broker, topic, group, 1) == {0: MESSAGES}


def test_a_partition_paused_behind_idemctls_back_is_reported_and_recovered(
    kafka_broker: KafkaBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The client pauses a partition idemctl did not pause: the watchdog finds it stalled
    (its warning, idemctl_stalled_partitions, /readyz 503 naming it), resumes it and goes
    back to the committed offset; every key runs once, and --exit-when-idle waits for it."""
    from confluent_kafka import TopicPartition
    from prometheus_client import CollectorRegistry

    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, [{"value": {"n": i}, "idem": f"s-{i}"} for i in range(60)])
    ran: Counter[str] = Counter()
    paused = threading.Event()

    def handler(event: Event, ctx: Context) -> None:
        ran[ctx.key] += 1
        if ctx.key == "s-9" and not paused.is_set():
            consumer._kafka.pause([TopicPartition(topic, 0)])  # behind idemctl's back
            paused.set()

    with open_store(f"sqlite:///{tmp_path}/keys.db") as store:
        opts = options(kafka_broker, topic, group, batch_size=5, stall_timeout=2.0,
                       exit_when_idle=1.0)  # fmt: skip
        consumer = Consumer(store, adapt(handler), opts, on_progress=lambda summary: None)
        registry = CollectorRegistry()
        ready = register(consumer, registry)
        answers: list[str | None] = []
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(0.05):  # a look every 50 ms until the test is done
                if consumer.summary.partitions:
                    answers.append(ready())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        summary = consumer.run()  # exits only once drained: the stall is no idle time
        sampling.set()
        sampler.join(10)
        stalls = registry.get_sample_value("idemctl_stalls_total")
    assert paused.is_set()
    assert set(ran) == {f"s-{i}" for i in range(60)} and max(ran.values()) == 1
    assert summary.stalls >= 1 and stalls == summary.stalls
    named = [a for a in answers if a and "stalled" in a]
    assert named and f"partition {topic}[0] stalled at offset" in named[0]
    assert answers[-1] is None  # ready again once recovered
    (warning,) = [r.getMessage() for r in caplog.records if "stalled at offset" in r.getMessage()]
    # Paused while s-5..9 ran: the fetch stood after them, or after the next round, fetched
    # meanwhile (the loop polls while a lane runs).
    at = int(re.search(r"stalled at offset (\d+) ", warning).group(1))  # type: ignore[union-attr]
    assert at in (10, 15)
    assert f"partition {topic}[0] stalled at offset {at} with {60 - at} messages behind" in warning
    assert "resumed it and went back to its committed offset" in warning
    assert committed(kafka_broker, topic, group, 1) == {0: 60}


def test_stall_timeout_is_checked() -> None:
    from idemctl.consume import ConsumeOptions
    from idemctl.errors import ConfigError

    with pytest.raises(ConfigError, match="--stall-timeout"):
        ConsumeOptions("127.0.0.1:9092", ["t"], "g", stall_timeout=-1)
