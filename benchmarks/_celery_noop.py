"""The Celery app of benchmarks/celery_tasks.py: one no-op task bare, the same guarded by
idemctl (``IdempotentTask``, its default key: the task's name and its arguments). Each
marks its end in the broker's Redis (the same one round trip for both)."""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

from idemctl.tasks.celery import IdempotentTask

BROKER = os.environ["BROKER_URL"]
app = Celery("bench", broker=BROKER)
app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=4,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
)
_marks = redis.Redis.from_url(BROKER)


def _mark(run: str) -> None:
    _marks.set(f"bench:{run}:first", time.time(), nx=True)
    _marks.set(f"bench:{run}:last", time.time())
    _marks.incr(f"bench:{run}:done")


@app.task(name="bench.bare")
def bare(run: str, i: int) -> None:
    _mark(run)


@app.task(name="bench.guarded", base=IdempotentTask)
def guarded(run: str, i: int) -> None:
    _mark(run)
