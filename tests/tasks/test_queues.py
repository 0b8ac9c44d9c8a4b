"""``examples/tasks/<queue>_app.py`` as black boxes (``tests/tasks/shop.py``): real Celery,
dramatiq, rq and taskiq workers on a real Redis broker, Celery's and dramatiq's on RabbitMQ
too (servers of the test's own, on free loopback ports, stopped by their PIDs), the store
on the Redis server, workers SIGKILLed for real; arq's are test_arq.py's. And Celery's and
dramatiq's doors' own rules, in one process, on the memory store."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("celery")

from idemctl import FingerprintMismatch, current_context, open_store
from tests.polling import wait_until
from tests.servers import RedisServer
from tests.tasks.shop import Shop, charge_through_a_kill


@pytest.mark.slow
@pytest.mark.timeout(600)  # a bound on a loaded machine, not a speed
@pytest.mark.parametrize(
    ("queue", "broker"),
    [(q, b) for q in ("celery", "dramatiq") for b in ("redis", "rabbitmq")]
    + [("rq", "redis"), ("taskiq", "redis")],
)
def test_orders_sent_again_and_a_killed_worker_charge_each_once(
    tmp_path: Path, redis: RedisServer, broker: str, queue: str, request: pytest.FixtureRequest
) -> None:
    """shop.charge_through_a_kill. On RabbitMQ the killed worker's unacknowledged messages
    come back when its connection drops; on Redis past Celery's visibility timeout, once
    dramatiq's worker missed its heartbeats, once rq's maintenance finds the job abandoned
    (its heartbeat lapsed), or once taskiq's stream entries are idle past its timeout."""
    pytest.importorskip("taskiq_redis" if queue == "taskiq" else queue)
    rabbit = request.getfixturevalue("rabbit") if broker == "rabbitmq" else None
    shop = Shop(
        tmp_path, redis, rabbit, queue,
        VISIBILITY_TIMEOUT="3", HEARTBEAT_TIMEOUT="3", IDLE_TIMEOUT="3", IDEMCTL_LEASE="3",
    )  # fmt: skip
    charge_through_a_kill(shop)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("queue", ["celery", "dramatiq", "rq", "taskiq"])
def test_with_a_fenced_ledger_a_kill_charges_no_order_twice(
    tmp_path: Path, redis: RedisServer, queue: str
) -> None:
    """The same scenario, the charges written to a fenced ledger (examples/tasks/ledger.py),
    one row an order: every order charged, the kill's cut-off charge replaced by its
    takeover's rather than refused; on Celery's and dramatiq's threads, rq's forked work
    horses and taskiq's asyncio tasks (arq's coroutines: tests/tasks/test_arq.py)."""
    pytest.importorskip("taskiq_redis" if queue == "taskiq" else queue)
    shop = Shop(
        tmp_path, redis, None, queue, fenced=True,
        VISIBILITY_TIMEOUT="3", HEARTBEAT_TIMEOUT="3", IDLE_TIMEOUT="3", IDEMCTL_LEASE="3",
    )  # fmt: skip
    charge_through_a_kill(shop)  # a row an order: what it checks is that none was lost
    # and no charge was refused (its logs name no FenceConflict or StaleFence)


@pytest.mark.slow
def test_a_redelivery_while_the_task_runs_waits_for_it(tmp_path: Path, redis: RedisServer) -> None:
    """A visibility timeout of 3 s, a 16 s charge, two workers, five orders: kombu hands each
    unacknowledged message to another worker every 3 s. With idemctl each order is charged
    once; the same task without idemctl, in the same broker, more than once."""
    shop = Shop(tmp_path, redis, VISIBILITY_TIMEOUT="3", CHARGE_SECONDS="16")
    orders = [f"order-{i}" for i in range(5)]
    bare = [f"bare-{i}" for i in range(5)]
    try:
        workers = [shop.start(), shop.start()]
        shop.send(orders)
        shop.settle(orders)
        guarded = shop.charges()
        shop.send(bare, bare=True)
        wait_until(
            lambda: all(shop.charges()[order] >= 2 for order in bare),
            "each bare order charged again", 120, procs=workers, detail=shop.logs,
        )  # fmt: skip
    finally:
        shop.stop()
    assert guarded == Counter({order: 1 for order in orders})
    assert all(shop.charges()[order] >= 2 for order in bare)  # the case is real


@pytest.mark.slow
def test_a_redelivery_while_the_task_runs_is_requeued_when_asked(
    tmp_path: Path, redis: RedisServer
) -> None:
    """The same redelivery with ``busy="requeue"``: each copy goes back to the queue (2 s)
    instead of waiting in a worker's slot, and once the first is done replays it."""
    shop = Shop(tmp_path, redis, VISIBILITY_TIMEOUT="3", CHARGE_SECONDS="8", IDEMCTL_BUSY="requeue")
    orders = [f"order-{i}" for i in range(3)]
    try:
        shop.start()
        shop.start()
        shop.send(orders)
        shop.settle(orders)
    finally:
        shop.stop()
    assert shop.charges() == Counter({order: 1 for order in orders})
    assert "is held by another attempt" in shop.logs(tail=None)  # copies came, re-queued


# The door's own rules, in one process (Celery's eager apply runs the worker's tracer) ----


@pytest.fixture
def app() -> Any:
    from celery import Celery

    app = Celery("t", broker="memory://")
    app.conf.task_always_eager = False
    return app


def test_a_repeat_returns_the_stored_result_and_another_amount_is_refused(app: Any) -> None:
    from idemctl.tasks.celery import IdempotentTask

    store = open_store("memory://")
    runs: list[tuple[str, int]] = []

    @app.task(base=IdempotentTask, idemctl_store=store, idemctl_key="{order}", name="shop.charge")
    def charge(order: str, amount: int) -> dict[str, Any]:
        runs.append((order, amount))
        return {"charged": amount, "token": current_context().fencing_token}

    first = charge.apply(("o-1", 100)).get()
    again = charge.apply(("o-1", 100)).get()
    assert first == again and first["charged"] == 100 and runs == [("o-1", 100)]
    assert charge("o-1", 100) == first  # called in this process: guarded too
    assert runs == [("o-1", 100)]
    with pytest.raises(FingerprintMismatch):
        charge.apply(("o-1", 200)).get()
    assert runs == [("o-1", 100)]
    assert store.get("task:celery:shop.charge#o-1") is not None  # the queue's, the task's


def test_the_default_key_is_the_name_and_the_arguments(app: Any) -> None:
    from idemctl.tasks.celery import IdempotentTask

    store = open_store("memory://")
    runs: list[int] = []

    @app.task(base=IdempotentTask, idemctl_store=store, name="shop.add")
    def add(a: int, b: int = 0) -> int:
        runs.append(a)
        return a + b

    assert add.apply((1, 2)).get() == 3
    assert add.apply((1,), {"b": 2}).get() == 3  # the same call, by keyword
    assert add.apply((2, 2)).get() == 4
    assert runs == [1, 2]
    keys = [r.key for r in store.scan().records]
    assert len(keys) == 2 and all(k.startswith("task:celery:shop.add#") for k in keys)


def test_a_failure_is_retried_by_celery_and_runs_again(app: Any) -> None:
    from idemctl.tasks.celery import IdempotentTask

    store = open_store("memory://")
    runs: list[int] = []

    @app.task(
        base=IdempotentTask, idemctl_store=store, idemctl_key="{n}", bind=True,
        max_retries=3,
    )  # fmt: skip
    def flaky(self: Any, n: int) -> int:
        runs.append(self.request.retries)
        if len(runs) < 3:
            raise self.retry(countdown=0)
        return n

    assert flaky.apply((7,)).get() == 7  # eager apply runs the retries in turn
    assert runs == [0, 1, 2]  # Celery's retries counted as Celery counts them


def test_a_held_key_is_requeued_with_a_countdown_not_counted_as_a_retry(
    app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery.exceptions import Retry

    from idemctl import KeyBusy
    from idemctl.tasks.celery import IdempotentTask

    store = open_store("memory://")
    store.claim("task:celery:shop.slow#1", None, 60)  # another worker's attempt, alive

    @app.task(
        base=IdempotentTask, idemctl_store=store, idemctl_key="{n}", name="shop.slow",
        idemctl_busy="requeue", idemctl_countdown=7,
    )  # fmt: skip
    def slow(n: int) -> int:
        raise AssertionError("ran beside the holder")

    # In this process (eager): nowhere to queue it, so KeyBusy.
    assert isinstance(slow.apply((1,), throw=False).result, KeyBusy)
    # As a worker runs it (its request pushed): sent again in 7 s, its retries as they were.
    sent: list[dict[str, Any]] = []

    class Signature:
        def __init__(self, **options: Any) -> None:
            self.options = options

        def apply_async(self) -> None:
            sent.append(self.options)

    monkeypatch.setattr(
        type(slow._get_current_object()),
        "signature_from_request",
        lambda self, request, args, kwargs, **options: Signature(args=args, **options),
    )
    slow.push_request(id="t-1", retries=2, called_directly=False, is_eager=False)
    try:
        with pytest.raises(Retry) as retry:
            slow(1)
    finally:
        slow.pop_request()
    assert retry.value.when == 7
    assert sent == [{"args": (1,), "countdown": 7, "retries": 2}]


def test_guard_keeps_the_tasks_base(app: Any) -> None:
    from idemctl.tasks.celery import IdempotentTask, guard

    store = open_store("memory://")
    runs: list[str] = []

    @app.task
    def ship(order: str) -> str:
        runs.append(order)
        return f"shipped {order}"

    guard(ship, store=store, key="{order}")
    assert ship.apply(("o-1",)).get() == ship.apply(("o-1",)).get() == "shipped o-1"
    assert runs == ["o-1"]
    assert not isinstance(app.tasks[ship.name], IdempotentTask)  # its base is its own


def test_a_soft_time_limit_is_a_retriable_handler_timeout(app: Any) -> None:
    from celery.exceptions import SoftTimeLimitExceeded

    from idemctl import HandlerTimeout, Status
    from idemctl.tasks.celery import IdempotentTask

    store = open_store("memory://")

    @app.task(base=IdempotentTask, idemctl_store=store, idemctl_key="{n}", name="shop.long")
    def long(n: int) -> int:
        raise SoftTimeLimitExceeded()

    result = long.apply((1,), throw=False)
    assert isinstance(result.result, HandlerTimeout)
    record = store.get("task:celery:shop.long#1")
    assert record is not None and record.status is Status.FAILED and record.retriable


def test_a_task_that_always_fails_ends_failed_after_celerys_retries(app: Any) -> None:
    from idemctl.tasks.celery import IdempotentTask

    store = open_store("memory://")
    runs: list[int] = []

    @app.task(
        base=IdempotentTask, idemctl_store=store, idemctl_key="{n}", name="shop.bad",
        autoretry_for=(ValueError,), max_retries=2, retry_backoff=False, default_retry_delay=0,
    )  # fmt: skip
    def bad(n: int) -> int:
        runs.append(n)
        raise ValueError("declined")

    result = bad.apply((1,), throw=False)
    assert result.state == "FAILURE" and isinstance(result.result, ValueError)
    assert runs == [1, 1, 1]  # the first run and Celery's two retries, each claimed again
    record = store.get("task:celery:shop.bad#1")
    assert record is not None and record.attempts == 3 and record.retriable  # Celery decides


@pytest.mark.clock
def test_a_killed_workers_task_runs_again_past_its_lease_as_a_takeover(app: Any) -> None:
    """The killed worker's claim (lease live: the redelivery waits, then is re-queued;
    lease passed: it runs, with a new fencing token)."""
    from idemctl import KeyBusy
    from idemctl.tasks.celery import IdempotentTask
    from tests.backends import expire_lease

    store = open_store("memory://")
    key = "task:celery:shop.charge#o-1"
    killed = store.claim(key, None, 600)  # the SIGKILLed worker's attempt
    seen: list[tuple[int, bool]] = []

    @app.task(
        base=IdempotentTask, idemctl_store=store, idemctl_key="{order}", idemctl_wait=0,
        name="shop.charge",
    )  # fmt: skip
    def charge(order: str) -> str:
        ctx = current_context()
        seen.append((ctx.fencing_token, ctx.takeover))
        return order

    assert isinstance(charge.apply(("o-1",), throw=False).result, KeyBusy)  # lease live
    assert seen == []
    expire_lease(store, key)
    assert charge.apply(("o-1",)).get() == "o-1"
    assert len(seen) == 1 and seen[0][1] is True  # a takeover
    assert seen[0][0] > killed.fencing_token  # with a newer token than the killed attempt's


# dramatiq's middleware, in one process (its StubBroker and an in-process worker) --------


def test_dramatiq_runs_a_guarded_actor_once_and_fails_a_reused_key_at_once() -> None:
    dramatiq = pytest.importorskip("dramatiq")
    from dramatiq.brokers.stub import StubBroker

    from idemctl.tasks.dramatiq import Idempotency

    store = open_store("memory://")
    broker = StubBroker()
    broker.emit_after("process_boot")
    broker.add_middleware(Idempotency(store=store))
    runs: list[tuple[str, int]] = []

    @dramatiq.actor(broker=broker, idemctl_key="{order}", max_retries=3, min_backoff=1)
    def charge(order: str, amount: int) -> None:
        runs.append((order, amount))

    @dramatiq.actor(broker=broker)
    def unguarded(order: str) -> None:
        runs.append((order, 0))

    worker = dramatiq.Worker(broker, worker_timeout=50)
    worker.start()
    try:
        for _ in range(3):
            charge.send("o-1", 100)
        unguarded.send("u-1")
        unguarded.send("u-1")
        broker.join(charge.queue_name)
        worker.join()
        assert sorted(runs) == [("o-1", 100), ("u-1", 0), ("u-1", 0)]
        charge.send("o-1", 200)  # the same key, another amount: not run, not retried
        broker.join(charge.queue_name, fail_fast=False)
        worker.join()
    finally:
        worker.stop()
    assert runs.count(("o-1", 200)) == 0
    assert len(broker.dead_letters) == 1
    record = store.get("task:dramatiq:charge#o-1")
    assert record is not None and record.attempts == 1
