"""The Celery app of benchmarks/celery_locks.py: examples/tasks/celery_app.py's app (its
configuration for at-least-once delivery through a worker's SIGKILL), with one charge task
under each guard compared, each recording its order as the example's does
(``examples/tasks/ledger.py``): ``charge_idemctl`` (``IdempotentTask``, claimed at
execution with a lease), ``charge_once`` (celery-once's ``QueueOnce``, graceful: a lock
taken at send, released when the task returns) and ``charge_singleton``
(celery-singleton's ``Singleton``: the same, its lock without an expiry)."""

from __future__ import annotations

import os

from celery_once import QueueOnce
from celery_singleton import Singleton

from examples.tasks.celery_app import app
from examples.tasks.ledger import record
from idemctl.tasks.celery import IdempotentTask

LOCKS = os.environ["LOCKS_URL"]
app.conf.update(
    ONCE={"backend": "celery_once.backends.Redis", "settings": {"url": LOCKS}},
    singleton_backend_url=LOCKS,
)


@app.task(name="locks.idemctl", base=IdempotentTask, idemctl_key="{order}",
          idemctl_lease=float(os.environ.get("IDEMCTL_LEASE", "3")))  # fmt: skip
def charge_idemctl(order: str, amount: int) -> None:
    record(order, amount)


@app.task(name="locks.once", base=QueueOnce, once={"graceful": True, "keys": ["order"]})
def charge_once(order: str, amount: int) -> None:
    record(order, amount)


@app.task(name="locks.singleton", base=Singleton, unique_on=["order"])
def charge_singleton(order: str, amount: int) -> None:
    record(order, amount)


TASKS = {
    "idemctl": charge_idemctl,
    "celery-once": charge_once,
    "celery-singleton": charge_singleton,
}
