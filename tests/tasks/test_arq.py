"""idemctl.tasks.arq with real arq: arq 0.28 requires redis-py below 6 and the test venv
has the Redis store's (7.3 or later), so these run in a venv of their own
(``scripts/test-arq``: ``pip install -e '.[arq]'`` and pytest), the store on SQLite. The
example's workers SIGKILLed (``tests/tasks/shop.py``), and the wrapper's rules on an
in-process worker in burst mode."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("arq", reason="arq needs redis-py below 6: scripts/test-arq runs these")

from arq import Retry, Worker, func
from arq.connections import RedisSettings, create_pool

from idemctl import FingerprintMismatch, current_context, open_store
from idemctl.tasks.arq import idempotent
from tests.servers import RedisServer
from tests.tasks.shop import Shop, charge_through_a_kill


@pytest.mark.slow
@pytest.mark.timeout(600)  # a bound on a loaded machine, not a speed
@pytest.mark.parametrize("fenced", [False, True], ids=["ledger", "fenced-ledger"])
def test_orders_sent_again_and_a_killed_worker_charge_each_once(
    tmp_path: Path, redis: RedisServer, fenced: bool
) -> None:
    """shop.charge_through_a_kill: arq runs a killed worker's jobs again once their
    in-progress markers expire (the 3 s job timeout plus 10 s). With the fenced ledger
    (examples/tasks/ledger.py) one row an order, none refused, as for the other queues
    (tests/tasks/test_queues.py)."""
    shop = Shop(tmp_path, redis, None, "arq", fenced=fenced, JOB_TIMEOUT="3", IDEMCTL_LEASE="3")
    charge_through_a_kill(shop)


def run_burst(redis: RedisServer, functions: list[Any], jobs: list[tuple[Any, ...]]) -> Worker:
    """Each of ``jobs`` (a function's name and its arguments) enqueued, then run by a worker
    in this process until the queue is empty, one at a time in the order sent, the functions
    named by their own names, as module-level jobs are. arq's queue is ordered by the time
    each job is due in ms, jobs due in the same ms by their random ids, and its worker runs
    ten at once: so each job is due a ms after the one before it (all of them already), and
    the worker takes one at a time."""
    settings = RedisSettings(host="127.0.0.1", port=redis.port)

    async def main() -> Worker:
        pool = await create_pool(settings)
        due = datetime.now(UTC) - timedelta(seconds=1)
        try:
            for n, (name, *args) in enumerate(jobs):
                await pool.enqueue_job(name, *args, _defer_until=due + timedelta(milliseconds=n))
            named = [func(f, name=f.__name__) for f in functions]
            worker = Worker(
                functions=named, redis_settings=settings, burst=True, poll_delay=0.05,
                handle_signals=False, max_jobs=1,
            )  # fmt: skip
            await worker.async_run()
            await worker.close()
            return worker
        finally:
            await pool.aclose()

    return asyncio.run(main())


def test_a_repeat_returns_the_stored_result_and_another_amount_fails(
    tmp_path: Path, redis: RedisServer
) -> None:
    store = open_store(f"sqlite:///{tmp_path}/store.db")
    runs: list[tuple[str, int]] = []

    @idempotent(store=store, key="{order}")
    async def charge(ctx: dict[str, Any], order: str, amount: int) -> dict[str, Any]:
        runs.append((order, amount))
        return {"charged": amount, "token": current_context().fencing_token}

    @idempotent(store=store)
    async def add(ctx: dict[str, Any], a: int, b: int = 0) -> int:
        runs.append(("add", a))
        return a + b

    worker = run_burst(
        redis, [charge, add],
        [("charge", "o-1", 100), ("charge", "o-1", 100), ("charge", "o-1", 200),
         ("add", 1, 2), ("add", 1, 2)],
    )  # fmt: skip
    assert sorted(runs) == [("add", 1), ("o-1", 100)]
    assert worker.jobs_complete == 4 and worker.jobs_failed == 1  # the other amount
    record = store.get(f"task:arq:{charge.__qualname__}#o-1")
    assert record is not None and record.result["charged"] == 100
    (added,) = [r.key for r in store.scan().records if ".add#" in r.key]
    assert added.startswith(f"task:arq:{add.__qualname__}#")  # the job's name, a fingerprint
    with pytest.raises(FingerprintMismatch):  # what failed that job
        asyncio.run(charge({}, "o-1", 200))


def test_arqs_retry_runs_the_job_again_and_a_held_key_comes_back_later(
    tmp_path: Path, redis: RedisServer
) -> None:
    store = open_store(f"sqlite:///{tmp_path}/store.db")
    runs: list[int] = []

    @idempotent(store=store, key="{n}")
    async def flaky(ctx: dict[str, Any], n: int) -> int:
        runs.append(ctx["job_try"])
        if ctx["job_try"] < 3:
            raise Retry(defer=0)
        return n

    worker = run_burst(redis, [flaky], [("flaky", 7)])
    assert runs == [1, 2, 3] and worker.jobs_retried == 2 and worker.jobs_complete == 1
    record = store.get(f"task:arq:{flaky.__qualname__}#7")
    assert record is not None and record.attempts == 3 and record.result == 7

    @idempotent(store=store, key="{n}", busy="requeue", countdown=0)
    async def held(ctx: dict[str, Any], n: int) -> int:
        raise AssertionError("ran beside the holder")

    store.claim(f"task:arq:{held.__qualname__}#1", None, 60)  # another worker's, alive

    with pytest.raises(Retry) as retry:  # for arq to run it again, counted in max_tries
        asyncio.run(held({"job_try": 1}, 1))
    assert retry.value.defer_score == 0


def test_a_job_must_be_a_coroutine_taking_ctx() -> None:
    with pytest.raises(TypeError, match="async def job"):
        idempotent(store="memory://")(lambda ctx: None)


def test_the_redis_store_on_arqs_redis_py_is_a_clear_error() -> None:
    """Beside arq, redis-py is below 6: the Redis store says what it needs instead of
    failing on its first call."""
    from idemctl import ConfigError

    with pytest.raises(ConfigError, match=r"redis-py 7\.3 or later .* redis-py 5\."):
        open_store("redis://127.0.0.1:6379/0")
