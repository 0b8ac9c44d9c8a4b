"""Claims sent ahead (issue 19): a round's keys are claimed in chunks of the store's
``claim_chunk``, the next chunk's claims answered while this chunk's handlers run. Against
the real broker and stores: per-partition order, each key once, offsets only past finished
messages, claims sent ahead given back on SIGTERM, and a store that fails on a later chunk
holding the partitions from there."""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from idemctl import Acquired, open_store
from idemctl.consume import Consumer, Event, adapt
from idemctl.errors import StoreUnavailable
from idemctl.model import ClaimOutcome, ClaimRequest
from idemctl.runner import Context
from tests.consume.test_consume import committed, names, options, produce
from tests.servers import KafkaBroker


def sizes_of_claims(store: Any) -> list[int]:
    """Record how many keys each claim_many call carries."""
    sizes: list[int] = []
    claim_many = store.claim_many

    def counted(requests: Sequence[ClaimRequest], lease: float | None = None) -> Any:
        sizes.append(len(requests))
        return claim_many(requests, lease)

    store.claim_many = counted
    return sizes


def keyed_topic(broker: KafkaBroker, n: int) -> tuple[str, str]:
    """A new topic of 2 partitions holding keys k-0 .. k-(n-1), and a group for it."""
    topic, group = names()
    broker.create_topic(topic, partitions=2)
    produce(broker, topic, [{"value": {"n": i}, "idem": f"k-{i}", "kkey": str(i).encode()}
                            for i in range(n)])  # fmt: skip
    return topic, group


def test_chunks_keep_each_partition_in_order_and_run_each_key_once(
    kafka_broker: KafkaBroker, store_url: str
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=3)
    keys = [f"o-{i}" for i in range(240)]
    dupes = [{"value": {"n": k}, "idem": k, "kkey": f"{k}x".encode()} for k in keys[:60]]
    produce(kafka_broker, topic, [{"value": {"n": k}, "idem": k, "kkey": k.encode()}
                                  for k in keys] + dupes)  # fmt: skip
    effects: Counter[str] = Counter()
    seen: dict[int, list[int]] = defaultdict(list)

    def handler(event: Event, ctx: Context) -> None:
        effects[ctx.key] += 1
        seen[event.partition].append(event.offset)

    with open_store(store_url) as store:
        store.claim_chunk = 7  # type: ignore[misc]
        sizes = sizes_of_claims(store)
        summary = Consumer(
            store, adapt(handler), options(kafka_broker, topic, group, batch_size=100)
        ).run()
    assert effects == Counter({k: 1 for k in keys})
    assert summary.counts["executed"] == 240 and summary.counts["replayed"] == 60
    assert max(sizes) <= 7 and len(sizes) >= 300 // 7  # claimed in chunks, not whole rounds
    for offsets in seen.values():  # each partition's handlers ran in offset order
        assert offsets == sorted(offsets)
    assert sum(committed(kafka_broker, topic, group, 3).values()) == 300


def test_sigterm_mid_round_gives_back_the_claims_sent_ahead(
    kafka_broker: KafkaBroker, store_url: str
) -> None:
    topic, group = keyed_topic(kafka_broker, 200)
    ran: list[str] = []
    consumer: Consumer | None = None

    def handler(event: Event, ctx: Context) -> None:
        ran.append(ctx.key)
        if len(ran) == 12:
            assert consumer is not None
            consumer.stop()  # what SIGTERM does: the handler in hand finishes, no more

    with open_store(store_url) as store:
        store.claim_chunk = 5  # type: ignore[misc]
        sizes = sizes_of_claims(store)
        consumer = Consumer(
            store, adapt(handler), options(kafka_broker, topic, group, batch_size=200)
        )
        summary = consumer.run()
        assert summary.counts["executed"] == len(ran) == 12
        assert sum(sizes) > 12  # claims had gone ahead of the handlers
        # Every key that did not run is free now: no claim sent ahead is left holding one.
        for i in range(200):
            if f"k-{i}" not in ran:
                assert isinstance(store.claim(f"k-{i}"), Acquired), f"k-{i}"
    ends = committed(kafka_broker, topic, group, 2)
    assert sum(o for o in ends.values() if o > 0) == 12  # exactly what ran (-1001: none)


def test_a_store_that_fails_on_a_later_chunk_holds_the_partitions_from_there(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = keyed_topic(kafka_broker, 120)
    effects: Counter[str] = Counter()
    lock = threading.Lock()

    def handler(event: Event, ctx: Context) -> None:
        with lock:
            effects[ctx.key] += 1

    with open_store(f"sqlite:///{tmp_path}/ahead.db") as store:
        store.claim_chunk = 10  # type: ignore[misc]
        claim_many = store.claim_many
        calls = [0]

        def third_fails(
            requests: Sequence[ClaimRequest], lease: float | None = None
        ) -> list[ClaimOutcome]:
            calls[0] += 1
            if calls[0] == 3:
                raise StoreUnavailable("down for one call")
            return claim_many(requests, lease)

        store.claim_many = third_fails  # type: ignore[method-assign]
        summary = Consumer(
            store, adapt(handler), options(kafka_broker, topic, group, batch_size=120)
        ).run()
    assert summary.counts["store_unavailable"] >= 1
    assert effects == Counter({f"k-{i}": 1 for i in range(120)})  # none lost, none twice
    assert sum(committed(kafka_broker, topic, group, 2).values()) == 120
