"""SQLite-specific: the embedded default is often created by several processes at once
(two `idemctl consume` started together on a new file)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

from idemctl import Acquired, open_store

PROCESSES = 8
ROUNDS = 8


def _first_use(url: str, barrier: Any, out: Any) -> None:
    store = open_store(url)
    barrier.wait()
    try:
        outcomes = [store.claim(f"k-{i}") for i in range(5)]
        out.put(sum(isinstance(o, Acquired) for o in outcomes))
    except Exception as exc:
        out.put(f"{type(exc).__name__}: {exc}")


def test_processes_creating_one_database_at_once_all_work(tmp_path: Path) -> None:
    """Each round, 8 processes open a database that does not exist yet and claim the same
    5 keys at once: none fails (a file turning to WAL under it, a stale view of the schema),
    and each key is acquired exactly once."""
    ctx = multiprocessing.get_context("spawn")
    for round_ in range(ROUNDS):
        url = f"sqlite:///{tmp_path}/round-{round_}.db"
        barrier, out = ctx.Barrier(PROCESSES), ctx.Queue()
        procs = [ctx.Process(target=_first_use, args=(url, barrier, out)) for _ in range(PROCESSES)]
        for p in procs:
            p.start()
        try:
            answers = [out.get(timeout=60) for _ in procs]
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
        errors = [a for a in answers if isinstance(a, str)]
        assert errors == [], f"round {round_}"
        assert sum(answers) == 5, f"round {round_}: {answers}"
