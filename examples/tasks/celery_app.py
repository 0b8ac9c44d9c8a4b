"""A Celery app whose ``charge`` task idemctl runs effectively once.

    BROKER_URL=redis://127.0.0.1:6379/0 IDEMCTL_STORE=redis://127.0.0.1:6379/1 \
        celery -A examples.tasks.celery_app worker --pool threads    # WORKER below

    >>> from examples.tasks.celery_app import send
    >>> send("order-1", 500)   # twice: charged once

Configured for at-least-once delivery through a worker's SIGKILL: a task is acknowledged
when it ends (``task_acks_late``), a lost worker's tasks go back to the queue
(``task_reject_on_worker_lost``), and the Redis broker hands a message not acknowledged
within ``$VISIBILITY_TIMEOUT`` seconds (default 3600) to another worker, looking for such
messages every second. That last one is what runs a long task twice without idemctl: its
copy waits here for the first's result instead.

Environment: ``$BROKER_URL`` (default redis://127.0.0.1:6379/0), ``$IDEMCTL_STORE`` (the
store; default the embedded SQLite file), ``$LEDGER`` (the file each charge appends its
order to, a line each; default ./ledger.txt; a ``*.db`` file: a fenced ledger,
``examples/tasks/ledger.py``), ``$CHARGE_SECONDS`` (how long a charge
takes, default 0), ``$IDEMCTL_LEASE`` (seconds, default 30: a killed worker's charge runs
again past it), ``$IDEMCTL_BUSY`` (what a copy that finds its charge running does: ``wait``
for its result, the default, or ``requeue`` itself to come again in 2 s).
"""

from __future__ import annotations

import os
import sys
import time

from celery import Celery

from examples.tasks.ledger import record
from idemctl.tasks.celery import IdempotentTask

app = Celery("shop", broker=os.environ.get("BROKER_URL", "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    broker_transport_options={
        "visibility_timeout": float(os.environ.get("VISIBILITY_TIMEOUT", "3600")),
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
)


def _charge(order: str, amount: int) -> None:
    time.sleep(float(os.environ.get("CHARGE_SECONDS", "0")))
    record(order, amount)


@app.task(
    base=IdempotentTask,
    idemctl_key="{order}",
    idemctl_lease=float(os.environ.get("IDEMCTL_LEASE", "30")),
    idemctl_busy=os.environ.get("IDEMCTL_BUSY", "wait"),
    idemctl_countdown=2,
)
def charge(order: str, amount: int) -> dict[str, object]:
    _charge(order, amount)
    return {"order": order, "amount": amount}


@app.task
def charge_bare(order: str, amount: int) -> dict[str, object]:
    """The same charge without idemctl: what a redelivery does to it."""
    _charge(order, amount)
    return {"order": order, "amount": amount}


def send(order: str, amount: int) -> None:
    charge.delay(order, amount)


def send_bare(order: str, amount: int) -> None:
    charge_bare.delay(order, amount)


WORKER = [
    sys.executable, "-m", "celery", "-A", "examples.tasks.celery_app", "worker",
    "--pool", "threads", "--concurrency", "4", "--loglevel", "INFO", "--without-gossip",
    "--without-mingle", "--without-heartbeat",
]  # fmt: skip
"""The argv that starts one worker, from the repository's root."""
