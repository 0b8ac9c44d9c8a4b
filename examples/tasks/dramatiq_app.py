"""A dramatiq app whose ``charge`` actor idemctl runs effectively once.

    BROKER_URL=redis://127.0.0.1:6379/0 IDEMCTL_STORE=redis://127.0.0.1:6379/1 \
        dramatiq examples.tasks.dramatiq_app --processes 1 --threads 4    # WORKER below

    >>> from examples.tasks.dramatiq_app import send
    >>> send("order-1", 500)   # twice: charged once

At least once through a worker's SIGKILL, as dramatiq is by default: a message is
acknowledged when its actor returns. A killed worker's messages come back when its
connection drops (RabbitMQ) or, on Redis, once the worker has missed its heartbeats for
``$HEARTBEAT_TIMEOUT`` seconds (default 60; every broker command looks for such workers
here, where dramatiq's default looks on one in a thousand).

Environment: ``$BROKER_URL`` (redis://... or amqp://...; default
redis://127.0.0.1:6379/0), ``$IDEMCTL_STORE``, ``$LEDGER`` (default ./ledger.txt; a ``*.db``
file: a fenced ledger, ``examples/tasks/ledger.py``), ``$CHARGE_SECONDS`` (default 0),
``$IDEMCTL_LEASE`` (seconds, default 30).
"""

from __future__ import annotations

import os
import sys
import time

import dramatiq

from examples.tasks.ledger import record
from idemctl.tasks.dramatiq import Idempotency

url = os.environ.get("BROKER_URL", "redis://127.0.0.1:6379/0")
if url.startswith("amqp"):
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    broker: dramatiq.Broker = RabbitmqBroker(url=url)
else:
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(
        url=url,
        heartbeat_timeout=int(float(os.environ.get("HEARTBEAT_TIMEOUT", "60")) * 1000),
        maintenance_chance=1_000_000,
    )
broker.add_middleware(Idempotency())  # before the actors are declared: it adds their options
dramatiq.set_broker(broker)


@dramatiq.actor(idemctl_key="{order}", idemctl_lease=float(os.environ.get("IDEMCTL_LEASE", "30")))
def charge(order: str, amount: int) -> None:
    time.sleep(float(os.environ.get("CHARGE_SECONDS", "0")))
    record(order, amount)


def send(order: str, amount: int) -> None:
    charge.send(order, amount)


WORKER = [sys.executable, "-m", "dramatiq", "examples.tasks.dramatiq_app", "--processes", "1",
          "--threads", "4"]  # fmt: skip
"""The argv that starts one worker, from the repository's root."""
