"""An arq app whose ``charge`` job idemctl runs effectively once.

    BROKER_URL=redis://127.0.0.1:6379/0 IDEMCTL_STORE=sqlite:///./idemctl.db \
        arq examples.tasks.arq_app.WorkerSettings    # WORKER below

    >>> from examples.tasks.arq_app import send
    >>> send("order-1", 500)   # twice: charged once

At least once through a worker's SIGKILL, as arq is by design: a job stays in arq's queue
until it finishes, and once its in-progress marker expires (the job's timeout,
``$JOB_TIMEOUT`` seconds, default 300, plus 10) a worker runs it again.

The store: arq 0.28 requires redis-py below 6, idemctl's Redis store 7.3 or later, so here
it is SQLite (or PostgreSQL, DynamoDB) beside the Redis broker.

Environment: ``$BROKER_URL`` (default redis://127.0.0.1:6379/0), ``$IDEMCTL_STORE``,
``$LEDGER`` (default ./ledger.txt; a ``*.db`` file: a fenced ledger,
``examples/tasks/ledger.py``), ``$CHARGE_SECONDS`` (default 0), ``$IDEMCTL_LEASE``
(seconds, default 30), ``$JOB_TIMEOUT``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any, ClassVar

from arq import create_pool
from arq.connections import RedisSettings

from examples.tasks.ledger import record
from idemctl.tasks.arq import idempotent

REDIS = RedisSettings.from_dsn(os.environ.get("BROKER_URL", "redis://127.0.0.1:6379/0"))


@idempotent(key="{order}", lease=float(os.environ.get("IDEMCTL_LEASE", "30")))
async def charge(ctx: dict[str, Any], order: str, amount: int) -> None:
    await asyncio.sleep(float(os.environ.get("CHARGE_SECONDS", "0")))
    record(order, amount)


def send(order: str, amount: int) -> None:
    async def enqueue() -> None:
        pool = await create_pool(REDIS)
        try:
            await pool.enqueue_job("charge", order, amount)
        finally:
            await pool.aclose()

    asyncio.run(enqueue())


class WorkerSettings:
    functions: ClassVar[list[Any]] = [charge]
    redis_settings = REDIS
    max_jobs = 4
    job_timeout = float(os.environ.get("JOB_TIMEOUT", "300"))


WORKER = [sys.executable, "-m", "arq", "examples.tasks.arq_app.WorkerSettings"]
"""The argv that starts one worker, from the repository's root."""
