"""idemctl's cost per Celery task: a no-op task bare against the same task guarded by
idemctl (``IdempotentTask`` on a Redis store), on one Redis server that is both the broker
and the store, one worker (threads pool), the same tasks queued before it starts.

    .venv/bin/python benchmarks/celery_tasks.py [--tasks 3000] [--rounds 3] [--concurrency 4]
        [--pool threads|prefork]

Bare and guarded run one after the other, ``--rounds`` times, each on new tasks; a run's
rate is its tasks over the time from its first task's end to its last one's (the worker's
start left out). The figure is the median of the rounds' ratios of bare to guarded time
per task (target: at most 1.3x). It starts its own redis-server on a free loopback port
(redis_claims.own_redis_server) and stops it by its PID.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import HOST, BenchError, stop_on_sigterm, stop_process
from redis_claims import own_redis_server

ROOT = Path(__file__).resolve().parent.parent
TARGET = 1.3


def one_run(port: int, kind: str, tasks: int, concurrency: int, pool: str = "threads") -> float:
    """Seconds per task of ``tasks`` no-op tasks of ``kind`` (bare, guarded)."""
    import redis

    run = uuid.uuid4().hex[:8]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("IDEMCTL_")},
        "BROKER_URL": f"redis://{HOST}:{port}/0",
        "IDEMCTL_STORE": f"redis://{HOST}:{port}/1",
        "PYTHONPATH": str(ROOT / "benchmarks"),
    }
    send = (
        "import sys\nfrom _celery_noop import bare, guarded\n"
        f"task = {kind}\nfor i in range(int(sys.argv[2])):\n    task.delay(sys.argv[1], i)\n"
    )
    subprocess.run([sys.executable, "-c", send, run, str(tasks)], env=env, check=True)
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "_celery_noop", "worker", "--pool", pool,
         "--concurrency", str(concurrency), "--loglevel", "WARNING", "--without-gossip",
         "--without-mingle", "--without-heartbeat"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    marks = redis.Redis(host=HOST, port=port)
    try:
        deadline = time.monotonic() + 600
        while int(marks.get(f"bench:{run}:done") or 0) < tasks:
            if worker.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"the {kind} worker did not finish its {tasks} tasks")
            time.sleep(0.2)
    finally:
        stop_process(worker)
    first = float(marks.get(f"bench:{run}:first") or 0)
    last = float(marks.get(f"bench:{run}:last") or 0)
    return (last - first) / (tasks - 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--pool", choices=("threads", "prefork"), default="threads",
        help="the worker's pool: threads (the examples'), or prefork (Celery's default)",
    )  # fmt: skip
    args = parser.parse_args()
    stop_on_sigterm()
    with own_redis_server() as url:
        from idemctl import open_store

        port = urlsplit(url).port or 6379
        open_store(f"redis://{HOST}:{port}/1").provision()
        ratios = []
        for r in range(args.rounds):
            bare = one_run(port, "bare", args.tasks, args.concurrency, args.pool)
            guarded = one_run(port, "guarded", args.tasks, args.concurrency, args.pool)
            ratios.append(guarded / bare)
            print(
                f"round {r + 1}: bare {bare * 1e3:.2f} ms/task ({1 / bare:,.0f}/s), "
                f"guarded {guarded * 1e3:.2f} ms/task ({1 / guarded:,.0f}/s): "
                f"{guarded / bare:.2f}x",
                flush=True,
            )
    median = statistics.median(ratios)
    verdict = "met" if median <= TARGET else "NOT met"
    print(f"guarded / bare, time per task: {median:.2f}x (median of {args.rounds}); "
          f"target <= {TARGET}x: {verdict}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
