"""An rq app whose ``charge`` job idemctl runs effectively once.

    BROKER_URL=redis://127.0.0.1:6379/0 IDEMCTL_STORE=redis://127.0.0.1:6379/1 \
        rq worker -c examples.tasks.rq_app --maintenance-interval 1    # WORKER below

    >>> from examples.tasks.rq_app import send
    >>> send("order-1", 500)   # twice: charged once

At least once through a worker's SIGKILL: each job is enqueued with ``Retry(max=3)``, so a
job whose worker died is retried once a worker's maintenance (every second here, where
rq's default is every 10 minutes) finds it abandoned: rq's heartbeat for a job lapses 60
seconds after its last beat.

Environment: ``$BROKER_URL`` (default redis://127.0.0.1:6379/0), ``$IDEMCTL_STORE``,
``$LEDGER`` (default ./ledger.txt; a ``*.db`` file: a fenced ledger,
``examples/tasks/ledger.py``), ``$CHARGE_SECONDS`` (default 0), ``$IDEMCTL_LEASE``
(seconds, default 30).
"""

from __future__ import annotations

import os
import sys
import time

from redis import Redis
from rq import Queue, Retry

from examples.tasks.ledger import record
from idemctl.tasks.rq import idempotent

REDIS_URL = os.environ.get("BROKER_URL", "redis://127.0.0.1:6379/0")
"""The broker, for the enqueuing side and for ``rq worker -c examples.tasks.rq_app``."""
queue = Queue("default", connection=Redis.from_url(REDIS_URL))


@idempotent(key="{order}", lease=float(os.environ.get("IDEMCTL_LEASE", "30")))
def charge(order: str, amount: int) -> None:
    time.sleep(float(os.environ.get("CHARGE_SECONDS", "0")))
    record(order, amount)


def send(order: str, amount: int) -> None:
    queue.enqueue(charge, order, amount, retry=Retry(max=3))


WORKER = [sys.executable, "-m", "rq.cli", "worker", "-c", "examples.tasks.rq_app",
          "--maintenance-interval", "1",
          "--job-monitoring-interval", "1"]  # fmt: skip
"""The argv that starts one worker, from the repository's root."""
