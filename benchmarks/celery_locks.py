"""The kill scenario of tests/tasks under idemctl, celery-once and celery-singleton: 300
orders sent twice, one Celery worker (threads, concurrency 4, ``acks_late``) SIGKILLed
once a third are charged and started again, 50 orders sent a third time once the first
are done; the same Redis server as broker, locks and idemctl's store.

    .venv/bin/python benchmarks/celery_locks.py [--orders 300] [--rounds 2]

For each guard it counts the orders charged, those charged more than once (and how many
charges in all), those never charged, and the locks left behind once the queue has
drained (celery-once's and celery-singleton's keys; idemctl's keys still in progress):
a stuck lock refuses that order's next send until it expires (celery-once: an hour by
default; celery-singleton: never). celery-once and celery-singleton lock at send time, so
their guard does nothing for a redelivery, and nothing for an order sent again after
the first is done; idemctl claims at execution and keeps the result. It starts its own
redis-server on a free loopback port and stops it by its PID.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from subprocess import Popen

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BenchError, stdout_console, stop_on_sigterm
from redis_claims import own_redis_server

ROOT = Path(__file__).resolve().parent.parent
GUARDS = ("idemctl", "celery-once", "celery-singleton")
LOCK_PATTERNS = {"idemctl": None, "celery-once": "qo_*", "celery-singleton": "SINGLETONLOCK_*"}
"""Where each keeps its locks, in the locks' Redis database (idemctl keeps records, not
locks: its keys still in progress are what it leaves held)."""


def one_run(url: str, guard: str, orders: int, folder: Path) -> dict[str, int]:
    import redis

    from idemctl import Status, open_store

    url = url.rsplit("/", 1)[0]  # the server's, without its database
    redis.Redis.from_url(url).flushall()
    ledger = folder / f"{guard}.txt"
    ledger.write_text("")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("IDEMCTL_")},
        "BROKER_URL": f"{url}/0", "LOCKS_URL": f"{url}/2", "IDEMCTL_STORE": f"{url}/1",
        "LEDGER": str(ledger), "VISIBILITY_TIMEOUT": "3",
        "PYTHONPATH": f"{ROOT / 'benchmarks'}{os.pathsep}{ROOT}",
    }  # fmt: skip
    open_store(env["IDEMCTL_STORE"]).provision()
    names = [f"order-{i}" for i in range(orders)]

    def send(which: list[str]) -> None:
        code = (
            "import sys\nfrom _celery_locks_app import TASKS\n"
            f"task = TASKS[{guard!r}]\nfor order in sys.argv[1:]:\n    task.delay(order, 100)\n"
        )
        subprocess.run([sys.executable, "-c", code, *which], env=env, check=True, timeout=120)

    def worker() -> Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "_celery_locks_app", "worker", "--pool",
             "threads", "--concurrency", "4", "--loglevel", "WARNING", "--without-gossip",
             "--without-mingle", "--without-heartbeat"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip

    def charges() -> Counter[str]:
        return Counter(ledger.read_text().split())

    broker = redis.Redis.from_url(f"{url}/0")

    def drained() -> bool:
        return broker.llen("celery") == 0 and broker.hlen("unacked") == 0

    def wait(
        condition: Callable[[], bool], what: str, timeout: float, procs: list[Popen[bytes]]
    ) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if any(p.poll() is not None for p in procs):
                raise BenchError(f"{guard}: a worker exited while waiting for {what}")
            if time.monotonic() > deadline:
                raise BenchError(f"{guard}: {what} did not happen within {timeout:g} s")
            time.sleep(0.2)

    send(names + names)
    first = worker()
    second = None
    try:
        wait(lambda: len(charges()) >= orders // 3, "a third charged", 120, [first])
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        second = worker()
        # Drained: nothing queued, nothing delivered and unacknowledged (the killed
        # worker's tasks stay in kombu's unacked hash until the visibility timeout).
        wait(drained, "the queue drained", 240, [second])
        send(names[:50])  # a third time, the first sends done
        wait(drained, "the third sends drained", 120, [second])
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    seen = charges()
    pattern = LOCK_PATTERNS[guard]
    if pattern is None:
        held = open_store(env["IDEMCTL_STORE"]).scan(Status.IN_PROGRESS, limit=orders).records
        stuck = len(held)
    else:
        stuck = len(redis.Redis.from_url(f"{url}/2").keys(pattern))
    return {
        "charged": len(set(seen) & set(names)),
        "repeated": sum(1 for n in seen.values() if n > 1),
        "extra_charges": sum(n - 1 for n in seen.values() if n > 1),
        "never": len(set(names) - set(seen)),
        "stuck_locks": stuck,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    stop_on_sigterm()
    from rich.table import Table

    table = Table(title=f"{args.orders} orders sent twice, a worker SIGKILLed, 50 sent again later")
    for column in ("guard", "round", "charged", "never charged", "orders charged twice+",
                   "extra charges", "locks left"):  # fmt: skip
        table.add_column(column, justify="left" if column == "guard" else "right")
    with own_redis_server() as url, tempfile.TemporaryDirectory(prefix="idemctl-locks-") as tmp:
        for round_ in range(1, args.rounds + 1):
            for guard in GUARDS:
                r = one_run(url, guard, args.orders, Path(tmp))
                figures = ("charged", "never", "repeated", "extra_charges", "stuck_locks")
                table.add_row(guard, str(round_), *(str(r[name]) for name in figures))
    stdout_console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
