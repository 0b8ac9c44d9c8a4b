"""The operator's commands at size: each a whole `idemctl` process (as an operator runs it)
on stores filled through the library with N keys, 1 in 100 left in progress with an expired
lease; the time at each size and its ratio to the smallest size's, measured in the same run.
Then a purge of many expired rows on PostgreSQL beside a claimer (claim and complete, one
key at a time, as a consumer does): the claims' p99 during the purge over their p99 before
it, and every claim's error.

    .venv/bin/python benchmarks/ops_scale.py [--stores redis,postgres,sqlite]
        [--sizes 50000,500000] [--purge-rows 1000000] [--json]

Starts redis-server and a throwaway PostgreSQL cluster (fsync on) on free loopback ports
and stops each by its PID. Targets (issue 33): at 10x the keys, stats, list --stale --limit
20 and unlock --stale --dry-run take at most 2x; the claims' p99 during a purge at most 2x.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BenchError, stdout_console, stop_on_sigterm

COMMANDS = {
    "stats": ["stats", "--json"],
    "list --stale --limit 20": ["list", "--stale", "--limit", "20", "--json"],
    "unlock --stale --dry-run": ["unlock", "--stale", "--dry-run", "--json"],
    "purge --dry-run": ["purge", "--dry-run", "--json"],
    "(idemctl --version)": ["--version"],
}
"""What is timed; --version is the process's own start, for scale."""
CHECKED = ("stats", "list --stale --limit 20", "unlock --stale --dry-run")
TARGET = 2.0
STALE_EVERY = 100
CHUNK = 500
IDEMCTL = [sys.executable, "-m", "idemctl"]


@contextlib.contextmanager
def server_for(store: str, tmp: str) -> Iterator[str]:
    """A base URL for ``store``'s stores (each size gets a prefix or schema of its own)."""
    if store == "redis":
        from redis_claims import own_redis_server

        with own_redis_server() as url:
            yield url
    elif store == "postgres":
        from postgres_claims import own_postgres_server

        with own_postgres_server(fsync=True) as (url, _pid):
            yield url
    else:
        yield f"sqlite:///{tmp}"


def store_url(store: str, base: str) -> str:
    name = f"s{uuid.uuid4().hex[:8]}"
    if store == "redis":
        return f"{base}?prefix={name}:"
    if store == "postgres":
        return f"{base}?schema={name}"
    return f"{base}/{name}.db"


def fill(url: str, n: int, retention: float | None = None) -> float:
    """``n`` keys through the library in batches: 1 in STALE_EVERY left in progress with
    a lease that has ended, the rest completed; the seconds it took."""
    from idemctl import Acquired, ClaimRequest, Completion, open_store

    started = time.perf_counter()
    with open_store(url) as store:
        store.provision()
        for start in range(0, n, CHUNK):
            keys = [f"k-{i:09d}" for i in range(start, min(start + CHUNK, n))]
            stale = [k for k in keys if int(k[2:]) % STALE_EVERY == 0]
            done = [k for k in keys if int(k[2:]) % STALE_EVERY != 0]
            if stale and retention is None:
                store.claim_many([ClaimRequest(k) for k in stale], lease=0.001)
            got = store.claim_many([ClaimRequest(k) for k in done])
            acquired = [o for o in got if isinstance(o, Acquired)]
            store.complete_many(
                [Completion(o.key, o.owner, o.fencing_token) for o in acquired], retention=retention
            )
    return time.perf_counter() - started


def timed(url: str, args: list[str], tries: int = 3) -> float:
    """The best of ``tries`` runs of ``idemctl --store URL ARGS``, in seconds."""
    best = float("inf")
    for _ in range(tries):
        started = time.perf_counter()
        done = subprocess.run(
            [*IDEMCTL, "--store", url, *args], capture_output=True, text=True, check=False
        )
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            raise BenchError(f"idemctl {' '.join(args)} exited {done.returncode}: {done.stderr}")
        best = min(best, elapsed)
    return best


def command_times(store: str, base: str, sizes: list[int]) -> list[dict[str, Any]]:
    rows = []
    for size in sizes:
        url = store_url(store, base)
        filled = fill(url, size)
        times = {name: timed(url, args) for name, args in COMMANDS.items()}
        rows.append({"store": store, "keys": size, "fill_s": filled, "seconds": times})
    return rows


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def claimer(url: str, stop: threading.Event, latencies: list[float], errors: list[str]) -> None:
    from idemctl import Acquired, open_store

    with open_store(url) as store:
        while not stop.is_set():
            key = f"live-{uuid.uuid4().hex}"
            started = time.perf_counter()
            try:
                got = store.claim(key)
                latencies.append(time.perf_counter() - started)
                if isinstance(got, Acquired):
                    store.complete(key, got.owner, got.fencing_token)
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")


def purge_beside_claims(
    base: str, rows: int, rate: int | None, quiet_s: float = 5.0
) -> dict[str, Any]:
    """PostgreSQL: ``rows`` keys completed with a retention of a millisecond (all past
    retention; the 1 in STALE_EVERY that ``fill`` would leave in progress are left out),
    then one claimer runs throughout: ``quiet_s`` alone, beside `idemctl purge --yes
    [--rate RATE]` until the purge ends, and ``quiet_s`` alone again. The baseline is both
    quiet spans, so a drift of the machine's load falls on both sides."""
    url = store_url("postgres", base)
    filled = fill(url, rows, retention=0.001)
    quiet: list[float] = []
    during: list[float] = []
    errors: list[str] = []

    def phase(latencies: list[float], work: Any) -> Any:
        stop = threading.Event()
        thread = threading.Thread(target=claimer, args=(url, stop, latencies, errors))
        thread.start()
        try:
            return work()
        finally:
            stop.set()
            thread.join()

    phase(quiet, lambda: time.sleep(quiet_s))
    started = time.perf_counter()
    paced = [] if rate is None else ["--rate", str(rate)]
    purge = phase(
        during,
        lambda: subprocess.run(
            [*IDEMCTL, "--store", url, "purge", "--yes", "--json", *paced],
            capture_output=True,
            text=True,
            check=False,
        ),
    )
    purge_s = time.perf_counter() - started
    phase(quiet, lambda: time.sleep(quiet_s))
    if purge.returncode != 0:
        raise BenchError(f"idemctl purge exited {purge.returncode}: {purge.stderr}")
    purged = json.loads(purge.stdout)["count"]
    before = quiet
    p99_before, p99_during = percentile(before, 0.99), percentile(during, 0.99)
    return {
        "rate": rate,
        "rows": rows,
        "fill_s": filled,
        "purged": purged,
        "purge_s": purge_s,
        "claims_before": len(before),
        "claims_during": len(during),
        "p50_before_ms": statistics.median(before) * 1000,
        "p50_during_ms": statistics.median(during) * 1000,
        "p99_before_ms": p99_before * 1000,
        "p99_during_ms": p99_during * 1000,
        "p99_ratio": p99_during / p99_before,
        "errors": errors[:5],
        "error_count": len(errors),
    }


def report(data: dict[str, Any]) -> None:
    from rich.table import Table

    console = stdout_console()
    table = Table(title="operator commands, seconds a whole process (best of 3)")
    for column in ("store", "keys", *COMMANDS):
        table.add_column(column, justify="right")
    smallest: dict[str, dict[str, float]] = {}
    verdicts: list[str] = []
    for row in data["commands"]:
        base = smallest.setdefault(row["store"], row["seconds"])
        cells = []
        for name in COMMANDS:
            ratio = row["seconds"][name] / base[name]
            cells.append(f"{row['seconds'][name]:.2f} ({ratio:.2f}x)")
            if name in CHECKED and row["seconds"] is not base:
                ok = "met" if ratio <= TARGET else "NOT met"
                verdicts.append(f"{row['store']} {name} at {row['keys']:,}: {ratio:.2f}x, {ok}")
        table.add_row(row["store"], f"{row['keys']:,}", *cells)
    console.print(table)
    for verdict in verdicts:
        console.print(f"  {verdict} (target <= {TARGET}x)", highlight=False)
    for purge in data["purges"]:
        paced = f" --rate {purge['rate']:,}" if purge["rate"] else ""
        console.print(
            f"PostgreSQL purge{paced} of {purge['purged']:,} expired rows in "
            f"{purge['purge_s']:.1f} s "
            f"beside a claimer: claim p99 {purge['p99_during_ms']:.2f} ms during / "
            f"{purge['p99_before_ms']:.2f} ms without = {purge['p99_ratio']:.2f}x (target <= "
            f"{TARGET}x: {'met' if purge['p99_ratio'] <= TARGET else 'NOT met'}); p50 "
            f"{purge['p50_during_ms']:.2f} / {purge['p50_before_ms']:.2f} ms; "
            f"{purge['claims_during']:,} claims during, {purge['error_count']} errors "
            f"{purge['errors']}",
            highlight=False,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="redis,postgres,sqlite")
    parser.add_argument("--sizes", default="50000,500000")
    parser.add_argument("--purge-rows", type=int, default=1_000_000, help="0: no purge run")
    parser.add_argument(
        "--purge-rates", default="0,50000", help="a purge run for each (0: unpaced), its own rows"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    stores = [s for s in args.stores.split(",") if s]
    sizes = sorted(int(s) for s in args.sizes.split(","))
    stop_on_sigterm()
    rates = [int(r) or None for r in args.purge_rates.split(",") if r]
    data: dict[str, Any] = {"commands": [], "purges": []}
    with tempfile.TemporaryDirectory() as tmp:
        for store in stores:
            with server_for(store, tmp) as base:
                data["commands"] += command_times(store, base, sizes)
                if store == "postgres" and args.purge_rows:
                    data["purges"] += [purge_beside_claims(base, args.purge_rows, r) for r in rates]
    report(data)
    if args.json:
        print(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
