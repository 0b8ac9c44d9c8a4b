"""The long tests first, one share to each worker: no worker is left running them alone at
the end.

pytest-xdist's ``--dist worksteal`` (pyproject's addopts) gives each of its N workers an
equal, consecutive part of the collection, then lets an idle worker take the last half of
the longest queue. In collection order the tests of a few modules (consumer processes on
a broker, kills, leases running out: 15 s to 80 s each, half the suite's seconds) ran
wherever they fell, and the last of them ran for minutes with one core of two idle (CI on
2 cores: 4 to 5 minutes at about one core). Here each worker's part begins with every
N-th of them, so they run first on every worker, and what is stolen at the end is short.
The order is the same in every worker, as xdist requires; serially (``-n 0``) it is
pytest's own.
"""

from __future__ import annotations

import os
from itertools import islice

import pytest

LONG = frozenset({
    "tests/consume/test_bad_messages.py",
    "tests/consume/test_chaos.py",
    "tests/consume/test_consume.py",
    "tests/consume/test_crash_window.py",
    "tests/consume/test_dead_letters.py",
    "tests/consume/test_demo.py",
    "tests/consume/test_pauses.py",
    "tests/consume/test_processes.py",
    "tests/consume/test_processes_edges.py",
    "tests/consume/test_safe_by_default.py",
    "tests/consume/test_spare_lanes.py",
    "tests/consume/test_stuck.py",
    "tests/faststream/test_example.py",
    "tests/outbox/test_relay_e2e.py",
    "tests/verify/test_verify.py",
    "tests/verify/test_verify_fenced.py",
})  # fmt: skip
"""Modules whose tests mostly take 15 s and more each (none has a module-scoped fixture,
which spreading its tests over the workers would start in each)."""


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected theirs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2 or config.getoption("dist", "worksteal") != "worksteal":
        return
    long = [item for item in items if item.nodeid.split("::")[0] in LONG]
    rest = iter([item for item in items if item.nodeid.split("::")[0] not in LONG])
    ordered: list[pytest.Item] = []
    left = len(items)
    for worker in range(workers):
        # worksteal's first split: each worker in turn gets len(left) // (workers left)
        size = left // (workers - worker)
        left -= size
        mine = long[worker::workers]
        ordered += mine + list(islice(rest, max(0, size - len(mine))))
    items[:] = ordered + list(rest)
