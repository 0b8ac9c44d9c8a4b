"""A taskiq app whose ``charge`` task idemctl runs effectively once.

    BROKER_URL=redis://127.0.0.1:6379/0 IDEMCTL_STORE=redis://127.0.0.1:6379/1 \
        taskiq worker examples.tasks.taskiq_app:broker --workers 1    # WORKER below

    >>> from examples.tasks.taskiq_app import send
    >>> send("order-1", 500)   # twice: charged once

At least once through a worker's SIGKILL: taskiq-redis' stream broker keeps each message
pending in its consumer group until the worker acknowledges it, once its result is saved
(taskiq's default ``--ack-type when_saved``). A killed worker's pending messages are
claimed by a live worker once idle for ``$IDLE_TIMEOUT`` seconds (default 600, the
broker's), which that broker looks for each time it has received new messages; its lock
on that search expires after 5 s here, where the broker's default never does (a worker
killed holding it would stop every search: taskiq-redis #131).

Environment: ``$BROKER_URL`` (default redis://127.0.0.1:6379/0), ``$IDEMCTL_STORE``,
``$LEDGER`` (default ./ledger.txt; a ``*.db`` file: a fenced ledger,
``examples/tasks/ledger.py``), ``$CHARGE_SECONDS`` (default 0), ``$IDEMCTL_LEASE``
(seconds, default 30), ``$IDLE_TIMEOUT``.
"""

from __future__ import annotations

import asyncio
import os
import sys

from taskiq_redis import RedisStreamBroker

from examples.tasks.ledger import record
from idemctl.tasks.taskiq import Idempotency

broker = RedisStreamBroker(
    os.environ.get("BROKER_URL", "redis://127.0.0.1:6379/0"),
    idle_timeout=int(float(os.environ.get("IDLE_TIMEOUT", "600")) * 1000),
    unacknowledged_lock_timeout=5,
    xread_count=4,  # no more delivered to a worker than its 4 tasks at a time
).with_middlewares(Idempotency())


@broker.task(idemctl_key="{order}", idemctl_lease=float(os.environ.get("IDEMCTL_LEASE", "30")))
async def charge(order: str, amount: int) -> None:
    await asyncio.sleep(float(os.environ.get("CHARGE_SECONDS", "0")))
    record(order, amount)


def send(order: str, amount: int) -> None:
    async def kick() -> None:
        await broker.startup()
        try:
            await charge.kiq(order, amount)
        finally:
            await broker.shutdown()

    asyncio.run(kick())


WORKER = [sys.executable, "-m", "taskiq", "worker", "examples.tasks.taskiq_app:broker",
          "--workers", "1", "--max-async-tasks", "4"]  # fmt: skip
"""The argv that starts one worker, from the repository's root."""
