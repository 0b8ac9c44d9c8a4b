"""Quickstart: four workers receive the same payments at least once; each is charged once.

Like Kafka after crashes, rebalances and producer retries, every payment is delivered one
to three times, sometimes to two workers at the same moment. The workers share the
embedded SQLite store; the charge (the side effect) is a row in a separate ledger.

    python examples/quickstart.py [--store sqlite:///./idemctl.db] [--payments 200]
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import sqlite3
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from idemctl import KeyBusy, StoreUnavailable, idempotent, open_store


def worker(store_url: str, ledger: str, deliveries: list[dict[str, Any]], out: Any) -> None:
    store = open_store(store_url)
    bank = sqlite3.connect(ledger, timeout=30, isolation_level=None)

    @idempotent(store, key="charge:{payment_id}", lease=10)
    def charge(payment_id: str, amount_cents: int) -> dict[str, Any]:
        bank.execute(
            "INSERT INTO charges (payment_id, amount_cents) VALUES (?, ?)",
            (payment_id, amount_cents),
        )
        return {"charged": amount_cents}

    retries = 0
    for message in deliveries:
        while True:
            try:
                charge(message["payment_id"], message["amount_cents"])
                break
            except (KeyBusy, StoreUnavailable):  # in flight elsewhere, or the store is
                # briefly out of reach: nothing was charged, so deliver it again shortly
                retries += 1
                time.sleep(0.005)
    out.put(retries)
    store.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", default="sqlite:///./idemctl.db")
    parser.add_argument("--payments", type=int, default=200)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()

    rng = random.Random(7)
    run_id = f"{int(time.time())}-{rng.randrange(10**6)}"
    payments = [
        {"payment_id": f"{run_id}/p{i:04d}", "amount_cents": rng.randrange(100, 10_000)}
        for i in range(args.payments)
    ]
    deliveries = [p for p in payments for _ in range(rng.choice((1, 1, 2, 3)))]
    rng.shuffle(deliveries)
    per_worker = [deliveries[w :: args.workers] for w in range(args.workers)]

    with tempfile.TemporaryDirectory() as tmp:
        ledger = str(Path(tmp) / "bank.db")
        sqlite3.connect(ledger).execute(
            "CREATE TABLE charges (payment_id TEXT, amount_cents INTEGER)"
        )
        with open_store(args.store) as store:
            store.provision()  # what `idemctl init` does; the workers would also manage alone
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        procs = [ctx.Process(target=worker, args=(args.store, ledger, d, out)) for d in per_worker]
        started = time.perf_counter()
        for p in procs:
            p.start()
        busy_retries = sum(out.get(timeout=300) for _ in procs)
        for p in procs:
            p.join()
        elapsed = time.perf_counter() - started
        charges = Counter(
            row[0] for row in sqlite3.connect(ledger).execute("SELECT payment_id FROM charges")
        )

    twice = sum(1 for n in charges.values() if n > 1)
    missed = sum(1 for p in payments if charges[p["payment_id"]] == 0)
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{args.workers} workers, store {open_store(args.store).url}")
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_row("payments", str(len(payments)))
    table.add_row("deliveries (at least once)", str(len(deliveries)))
    table.add_row("duplicates replayed, not charged", str(len(deliveries) - len(payments)))
    table.add_row("busy: delivered to two workers at once, retried", str(busy_retries))
    table.add_row("charges made", str(sum(charges.values())))
    table.add_row("payments charged twice", f"[{'red' if twice else 'green'}]{twice}[/]")
    table.add_row("payments never charged", f"[{'red' if missed else 'green'}]{missed}[/]")
    console = Console()
    console.print(table)
    verdict = (
        "every payment charged exactly once" if not twice and not missed else "NOT exactly once"
    )
    console.print(f"{verdict} ({elapsed:.2f}s)")
    raise SystemExit(0 if not twice and not missed else 1)


if __name__ == "__main__":
    main()
