"""idemctl.tasks.taskiq's own rules, in one process: taskiq's InMemoryBroker runs each task
through its receiver and middlewares, as a worker does, with the memory store. The real
worker on Redis, SIGKILLed, is test_queues.py's."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("taskiq")

from taskiq import InMemoryBroker, SimpleRetryMiddleware

from idemctl import FingerprintMismatch, KeyBusy, current_context, open_store
from idemctl.tasks.taskiq import Idempotency
from tests.polling import wait_until_async
from tests.servers import RedisServer


def test_async_and_sync_tasks_run_once_and_replay_their_result() -> None:
    store = open_store("memory://")
    broker = InMemoryBroker().with_middlewares(Idempotency(store=store))
    runs: list[tuple[str, int]] = []

    @broker.task(idemctl_key="{order}", task_name="shop.charge")
    async def charge(order: str, amount: int) -> dict[str, Any]:
        runs.append((order, amount))
        return {"charged": amount, "token": current_context().fencing_token}

    @broker.task(idempotent=True, task_name="shop.add")
    def add(a: int, b: int = 0) -> int:
        runs.append(("add", a))
        return a + b

    @broker.task
    async def unguarded(order: str) -> None:
        runs.append((order, 0))

    async def main() -> list[Any]:
        await broker.startup()
        try:
            results = []
            for call in (
                charge.kiq("o-1", 100), charge.kiq("o-1", 100), charge.kiq("o-1", 200),
                add.kiq(1, 2), add.kiq(1, b=2), unguarded.kiq("u-1"), unguarded.kiq("u-1"),
            ):  # fmt: skip
                results.append(await (await call).wait_result(timeout=10))
            return results
        finally:
            await broker.shutdown()

    first, again, other, added, added_again, *_ = asyncio.run(main())
    assert not first.is_err and first.return_value == again.return_value
    assert first.return_value["charged"] == 100
    assert other.is_err and isinstance(other.error, FingerprintMismatch)
    assert added.return_value == added_again.return_value == 3
    assert sorted(runs) == [("add", 1), ("o-1", 100), ("u-1", 0), ("u-1", 0)]
    assert store.get("task:taskiq:shop.charge#o-1") is not None
    assert [r.key for r in store.scan().records if r.key.startswith("task:taskiq:shop.add#")]


def test_a_failure_is_retried_by_taskiqs_retry_middleware_and_a_held_key_is_busy() -> None:
    store = open_store("memory://")
    store.claim("task:taskiq:shop.held#1", None, 60)  # another worker's attempt, alive
    broker = InMemoryBroker().with_middlewares(
        Idempotency(store=store), SimpleRetryMiddleware(default_retry_count=3)
    )
    runs: list[int] = []

    @broker.task(idemctl_key="{n}", task_name="shop.flaky", retry_on_error=True)
    async def flaky(n: int) -> int:
        runs.append(n)
        if len(runs) < 3:
            raise ValueError("declined")
        return n

    @broker.task(idemctl_key="{n}", task_name="shop.held", idemctl_busy="requeue")
    async def held(n: int) -> int:
        raise AssertionError("ran beside the holder")

    key = "task:taskiq:shop.flaky#7"

    async def main() -> Any:
        await broker.startup()
        try:
            await flaky.kiq(7)
            busy = await (await held.kiq(1)).wait_result(timeout=10)
            await wait_until_async(  # the retries are sent again through the broker
                lambda: len(runs) == 3 and getattr(store.get(key), "result", None) == 7,
                "the third run's result stored", 30,
            )  # fmt: skip
            return busy
        finally:
            await broker.shutdown()

    busy = asyncio.run(main())
    assert isinstance(busy.error, KeyBusy)
    assert runs == [7, 7, 7]
    record = store.get(key)
    assert record is not None and record.attempts == 3 and record.result == 7


def test_the_calls_are_counted_by_queue_task_and_outcome_for_prometheus() -> None:
    """idemctl.metrics.register_tasks: the doors' calls in this process, as a worker's
    Prometheus registry serves them."""
    from prometheus_client import CollectorRegistry, generate_latest

    from idemctl.metrics import register_tasks

    store = open_store("memory://")
    broker = InMemoryBroker().with_middlewares(Idempotency(store=store))

    @broker.task(idemctl_key="{order}", task_name="shop.counted")
    async def counted(order: str, amount: int) -> int:
        return amount

    async def main() -> None:
        await broker.startup()
        try:
            for amount in (100, 100, 200):
                await (await counted.kiq("o-1", amount)).wait_result(timeout=10)
        finally:
            await broker.shutdown()

    asyncio.run(main())
    registry = CollectorRegistry()
    register_tasks(registry)
    text = generate_latest(registry).decode()
    labels = 'outcome="{}",queue="taskiq",task="shop.counted"'
    for outcome in ("new", "replayed", "mismatch"):
        assert f"idemctl_task_calls_total{{{labels.format(outcome)}}} 1.0" in text, text
    assert 'idemctl_task_seconds_count{queue="taskiq",task="shop.counted"} 3.0' in text


def test_an_async_task_guarded_in_two_event_loops_opens_its_store_in_each(
    redis: RedisServer,
) -> None:
    """A coroutine task on the Redis store's asyncio client, run under one event loop and
    then another (a worker restarted in-process, a test's second ``asyncio.run``): the
    second loop gets a client of its own, not the first loop's closed connections."""
    url = f"redis://127.0.0.1:{redis.port}/0"
    open_store(url).provision()
    broker = InMemoryBroker().with_middlewares(Idempotency(store=url))
    runs: list[str] = []

    @broker.task(idemctl_key="{order}", task_name="shop.looped")
    async def looped(order: str) -> str:
        runs.append(order)
        return order

    async def main(order: str) -> Any:
        await broker.startup()
        try:
            return await (await looped.kiq(order)).wait_result(timeout=10)
        finally:
            await broker.shutdown()

    first = asyncio.run(main("o-1"))
    second = asyncio.run(main("o-2"))
    again = asyncio.run(main("o-1"))
    assert not first.is_err and not second.is_err and not again.is_err, (second.error, again.error)
    assert (first.return_value, second.return_value, again.return_value) == ("o-1", "o-2", "o-1")
    assert runs == ["o-1", "o-2"]  # the third, a repeat, replayed from the store
