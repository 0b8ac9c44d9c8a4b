"""The Celery app of benchmarks/celery_locks.py: one charge task under each guard compared,
each appending its order to ``$LEDGER``: ``charge_idemctl`` (``IdempotentTask``, claimed at
execution with a lease), ``charge_once`` (celery-once's ``QueueOnce``, graceful: a lock
taken at send, released when the task returns) and ``charge_singleton``
(celery-singleton's ``Singleton``: the same, its lock without an expiry). Configured as
examples/tasks/celery_app.py is, for at-least-once delivery through a worker's SIGKILL."""

from __future__ import annotations

import os
import time

from celery import Celery
from celery_once import QueueOnce
from celery_singleton import Singleton

from idemctl.tasks.celery import IdempotentTask

BROKER = os.environ["BROKER_URL"]
LOCKS = os.environ["LOCKS_URL"]
app = Celery("locks", broker=BROKER)
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    broker_transport_options={
        "visibility_timeout": float(os.environ.get("VISIBILITY_TIMEOUT", "3")),
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
    ONCE={"backend": "celery_once.backends.Redis", "settings": {"url": LOCKS}},
    singleton_backend_url=LOCKS,
)


def _charge(order: str) -> None:
    time.sleep(float(os.environ.get("CHARGE_SECONDS", "0")))
    with open(os.environ["LEDGER"], "a") as ledger:
        ledger.write(f"{order}\n")


@app.task(name="locks.idemctl", base=IdempotentTask, idemctl_key="{order}",
          idemctl_lease=float(os.environ.get("IDEMCTL_LEASE", "3")))  # fmt: skip
def charge_idemctl(order: str, amount: int) -> None:
    _charge(order)


@app.task(name="locks.once", base=QueueOnce, once={"graceful": True, "keys": ["order"]})
def charge_once(order: str, amount: int) -> None:
    _charge(order)


@app.task(name="locks.singleton", base=Singleton, unique_on=["order"])
def charge_singleton(order: str, amount: int) -> None:
    _charge(order)


TASKS = {
    "idemctl": charge_idemctl,
    "celery-once": charge_once,
    "celery-singleton": charge_singleton,
}
