"""The sequence guard end to end through ``run(..., order=...)``, on every store: events
delivered out of order and more than once never apply an older sequence after a newer one.

Effects are counted in a ledger file the handler appends to, never from return values."""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from pathlib import Path

import pytest

from tests.backends import Backend
from tests.contract.ordering import Event, deliver
from tests.contract.race import race

ENTITIES = 200
EVENTS_PER_ENTITY = 4
SLOW_STORE_ENTITIES = 60
"""On DynamoDB (moto's server answers a few hundred requests a second here, four a run):
as many races per entity, fewer entities, so the suite stays within CI's time."""


def _ledger(path: Path) -> list[tuple[str, int, int]]:
    rows = []
    for line in path.read_text().splitlines():
        entity, sequence, worker = line.split()
        rows.append((entity, int(sequence), int(worker)))
    return rows


@pytest.mark.slow
def test_shuffled_duplicated_events_apply_in_sequence_order(
    backend: Backend, tmp_path: Path
) -> None:
    """200 entities' events (60 on DynamoDB), shuffled over three partitions with 20%
    duplicates (some in another partition), handled by three workers at once."""
    rng = random.Random(17)
    entities = SLOW_STORE_ENTITIES if backend.name == "dynamodb" else ENTITIES
    events: list[Event] = [
        (f"acct:{e:03d}", s) for e in range(entities) for s in range(1, EVENTS_PER_ENTITY + 1)
    ]
    partitions: list[list[Event]] = [[], [], []]
    for event in events:
        partitions[rng.randrange(3)].append(event)
    for event in rng.sample(events, len(events) // 5):
        partitions[rng.randrange(3)].append(event)
    for part in partitions:
        rng.shuffle(part)
    ledger = tmp_path / "ledger.txt"
    results: dict[int, dict[str, list[str]]] = {}
    stores = [backend.open() for _ in partitions]

    def worker(w: int) -> None:
        results[w] = deliver(stores[w], partitions[w], str(ledger), w)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(len(partitions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()  # deliver raises on a stall
    assert len(results) == len(partitions), "a worker did not finish"

    applied: dict[str, list[int]] = defaultdict(list)
    for entity, sequence, _ in _ledger(ledger):
        applied[entity].append(sequence)
    outcomes: dict[str, list[str]] = defaultdict(list)
    for r in results.values():
        for key, seen in r.items():
            outcomes[key] += seen
    stale = {k for k, seen in outcomes.items() if "stale" in seen}
    ran = {f"{e}#{s}" for e, seqs in applied.items() for s in seqs}
    for entity, seqs in applied.items():
        # Never an older sequence after a newer one, and none twice.
        assert seqs == sorted(set(seqs)), (entity, seqs)
    # The final state is what applying the entity's events in order gives: its last one.
    assert {e: seqs[-1] for e, seqs in applied.items()} == {
        f"acct:{e:03d}": EVENTS_PER_ENTITY for e in range(entities)
    }
    # Every event either ran once or was reported stale (and never ran).
    assert ran.isdisjoint(stale)
    assert ran | stale == {f"{e}#{s}" for e, s in events}
    assert all(set(seen) <= {"executed", "stale", "replayed"} for seen in outcomes.values())
    assert sum(seen.count("executed") for seen in outcomes.values()) == len(ran)
    # A duplicate of a decided event replays: it never runs again.
    assert sum(len(seen) for seen in outcomes.values()) == sum(len(p) for p in partitions)
    store = stores[0]
    for e in range(0, entities, 20):
        found = store.get_entity(f"acct:{e:03d}")
        assert found is not None and found.sequence == EVENTS_PER_ENTITY
        assert found.key == f"acct:{e:03d}#{EVENTS_PER_ENTITY}" and found.holder is None
    for s in stores:
        s.close()


@pytest.mark.slow
def test_two_processes_racing_one_entity_never_apply_backwards(
    backend: Backend, tmp_path: Path
) -> None:
    """Two processes (threads for in-process stores) deliver sequences 1..N of one entity,
    each in its own order: the entity ends at N and the applied sequences only go up."""
    n = 60
    orders: list[list[Event]] = [
        random.Random(w).sample([("acct:race", s) for s in range(1, n + 1)], n) for w in (1, 2)
    ]
    # Interleave: each worker's events in ascending runs broken by a few late ones.
    for events in orders:
        events.sort(key=lambda e: e[1] + random.Random(e[1]).randrange(-8, 8))
    ledger = tmp_path / "ledger.txt"
    results = race(backend, deliver, orders, str(ledger))
    assert sorted(results) == [0, 1]
    applied = [sequence for _, sequence, _ in _ledger(ledger)]
    assert applied == sorted(set(applied)), applied
    assert applied[-1] == n
    store = backend.open()
    try:
        entity = store.get_entity("acct:race")
        assert entity is not None and entity.sequence == n and entity.holder is None
    finally:
        store.close()
