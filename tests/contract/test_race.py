"""8 workers claim the same 200 keys (80 on DynamoDB) at once: every key's handler runs
exactly once.

Runs are counted in a ledger file the handler appends to, never from return values.
Stores reachable from other processes race in 8 OS processes; memory:// in 8 threads.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from idemctl.model import Status
from tests.backends import Backend
from tests.contract.race import race, work

WORKERS = 8
KEYS = [f"payment-{i:03d}" for i in range(200)]
SLOW_STORE_KEYS = 80
"""On DynamoDB (moto's server, the suite's slowest store): as many workers racing, on fewer
keys, so the suite stays within CI's time."""


@pytest.mark.slow
def test_race_every_handler_runs_exactly_once(backend: Backend, tmp_path: Path) -> None:
    keys = KEYS[:SLOW_STORE_KEYS] if backend.name == "dynamodb" else KEYS
    ledger = str(tmp_path / "ledger.txt")
    results = race(backend, work, [keys] * WORKERS, ledger)
    lines = Path(ledger).read_text().splitlines()
    runs = Counter(line.split()[0] for line in lines)
    assert set(runs) == set(keys)
    assert [k for k, n in runs.items() if n != 1] == []
    assert sum(c["executed"] for c in results.values()) == len(keys)
    for counts in results.values():
        assert counts["other"] == 0
        assert counts["executed"] + counts["replayed"] == len(keys)

    # The stored result of every key names the worker whose run the ledger recorded, and
    # that run's fencing token is the key's: one claim won, nobody took it over.
    ran_by = {line.split()[0]: int(line.split()[1]) for line in lines}
    ran_with = {line.split()[0]: int(line.split()[2]) for line in lines}
    store = backend.open()
    try:
        for key in keys:
            record = store.get(key)
            assert record is not None and record.status is Status.COMPLETED
            assert record.result == {"worker": ran_by[key]}
            assert record.fencing_token == ran_with[key] and record.attempts == 1
    finally:
        store.close()
