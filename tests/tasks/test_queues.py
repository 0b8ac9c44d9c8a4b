"""``examples/tasks/<queue>_app.py`` as black boxes: real Celery and dramatiq workers on a
real Redis broker and on RabbitMQ (servers of the test's own, on free loopback ports,
stopped by their PIDs), the store on the Redis server, workers SIGKILLed for real. And
each door's own rules, in one process, on the memory store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("celery")

from idemctl import FingerprintMismatch, current_context, open_store
from tests.polling import wait_until
from tests.servers import RedisServer
from tests.tasks.rabbit import RabbitServer

REPO = Path(__file__).resolve().parents[2]
QUEUE_KEYS = {
    "celery": ("celery", "unacked"),
    "dramatiq": ("dramatiq:default", "dramatiq:default.msgs"),
    "rq": ("rq:queue:default", "rq:wip:default"),
}
"""Each queue's Redis keys: the list of messages waiting, and the hash (Celery, dramatiq) or
sorted set (rq: jobs started) of those delivered and not yet acknowledged. taskiq's are a
stream and its consumer group (``Shop.drained``)."""


class Shop:
    """The example's broker, store, ledger and workers."""

    def __init__(
        self,
        folder: Path,
        redis: RedisServer,
        rabbit: RabbitServer | None = None,
        queue: str = "celery",
        **env: str,
    ) -> None:
        """``examples/tasks/<queue>_app.py``, its store on ``redis``; its broker too, or
        ``rabbit``."""
        self.folder, self.redis, self.rabbit, self.queue = folder, redis, rabbit, queue
        self.ledger = folder / "ledger.txt"
        self.ledger.touch()
        base = f"redis://127.0.0.1:{redis.port}"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("IDEMCTL_")},
            "BROKER_URL": f"{base}/0" if rabbit is None else rabbit.url,
            "IDEMCTL_STORE": f"{base}/1",
            "LEDGER": str(self.ledger),
            "PYTHONPATH": str(REPO),
            **env,
        }
        open_store(self.env["IDEMCTL_STORE"]).provision()
        self.workers: list[subprocess.Popen[bytes]] = []

    def _example(self) -> Any:
        import importlib

        return importlib.import_module(f"examples.tasks.{self.queue}_app")

    def send(self, orders: list[str], bare: bool = False) -> None:
        """Each order sent through the example's ``send`` (``send_bare``), in a process
        with the example's environment."""
        call = "send_bare" if bare else "send"
        code = (
            f"import sys\nfrom examples.tasks.{self.queue}_app import {call}\n"
            f"for order in sys.argv[1:]:\n    {call}(order, 100)\n"
        )
        subprocess.run(
            [sys.executable, "-c", code, *orders], cwd=REPO, env=self.env, check=True, timeout=60
        )

    def start(self) -> subprocess.Popen[bytes]:
        log = (self.folder / f"worker-{len(self.workers)}.log").open("wb")
        proc = subprocess.Popen(
            self._example().WORKER, cwd=REPO, env=self.env, stdout=log, stderr=log,
            start_new_session=True,
        )  # fmt: skip
        self.workers.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def charges(self) -> Counter[str]:
        return Counter(self.ledger.read_text().split())

    def drained(self) -> bool:
        """Nothing queued, nothing delivered and not acknowledged."""
        if self.rabbit is not None:
            return self.rabbit.pending() == 0
        import redis

        client = redis.Redis(port=self.redis.port, db=0)
        try:
            if self.queue == "taskiq":  # none left to deliver (lag), none unacknowledged
                (group,) = client.xinfo_groups("taskiq")
                return group["lag"] == 0 and group["pending"] == 0
            queued, held = QUEUE_KEYS[self.queue]
            count = client.zcard if self.queue == "rq" else client.hlen
            return client.llen(queued) == 0 and count(held) == 0
        finally:
            client.close()

    def reclaimable(self) -> bool:
        """taskiq-redis' stream broker claims a dead worker's messages (idle past its
        ``idle_timeout``, 3 s here) only when it next receives new ones: true once it has
        delivered all it had and what the killed worker held is idle that long. True at
        once for the other queues, which bring such messages back by themselves."""
        if self.queue != "taskiq":
            return True
        import redis

        client = redis.Redis(port=self.redis.port, db=0)
        try:
            (group,) = client.xinfo_groups("taskiq")
            held = client.xpending_range("taskiq", "taskiq", "-", "+", 1000)
            return group["lag"] == 0 and all(m["time_since_delivered"] >= 3000 for m in held)
        finally:
            client.close()

    def settle(self, orders: list[str], timeout: float = 120) -> None:
        """Wait until every one of ``orders`` is charged and nothing is left in the broker
        (so no charge can come after), failing early if a worker exits."""
        live = [proc for proc in self.workers if proc.poll() is None]
        wait_until(
            lambda: set(self.charges()) == set(orders) and self.drained(),
            f"the {len(orders)} orders charged and the queue drained", timeout, procs=live,
            detail=self.logs,
        )  # fmt: skip

    def logs(self, tail: int | None = 1500) -> str:
        """The workers' logs (each one's last ``tail`` characters)."""
        texts = (p.read_text(errors="replace") for p in sorted(self.folder.glob("worker-*.log")))
        return "\n".join(text[-tail:] if tail else text for text in texts)


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def rabbit(tmp_path: Path) -> Iterator[RabbitServer]:
    server = RabbitServer(tmp_path / "rabbit").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("queue", "broker"),
    [(q, b) for q in ("celery", "dramatiq") for b in ("redis", "rabbitmq")]
    + [("rq", "redis"), ("taskiq", "redis")],
)
def test_orders_sent_again_and_a_killed_worker_charge_each_once(
    tmp_path: Path, redis: RedisServer, broker: str, queue: str, request: pytest.FixtureRequest
) -> None:
    """300 orders sent twice, a worker SIGKILLed mid-run and started again, 50 sent a third
    time: every order charged, a repeat only where the kill cut in (at most the worker's 4
    threads). On RabbitMQ the killed worker's unacknowledged messages come back when its
    connection drops; on Redis past Celery's visibility timeout, or once dramatiq's worker
    missed its heartbeats."""
    pytest.importorskip("taskiq_redis" if queue == "taskiq" else queue)
    rabbit = request.getfixturevalue("rabbit") if broker == "rabbitmq" else None
    shop = Shop(
        tmp_path, redis, rabbit, queue,
        VISIBILITY_TIMEOUT="3", HEARTBEAT_TIMEOUT="3", IDLE_TIMEOUT="3", IDEMCTL_LEASE="3",
    )  # fmt: skip
    orders = [f"order-{i}" for i in range(300)]
    try:
        shop.send(orders + orders)
        first = shop.start()
        wait_until(lambda: len(shop.charges()) >= 100, "a third charged", 120, procs=[first],
                   detail=shop.logs)  # fmt: skip
        shop.kill(first)
        shop.start()
        wait_until(shop.reclaimable, "the killed worker's messages reclaimable", 120,
                   detail=shop.logs)  # fmt: skip
        shop.send(orders[:50])
        shop.settle(orders, 180)
    finally:
        shop.stop()
    charges = shop.charges()
    assert set(charges) == set(orders)
    repeated = {order: n for order, n in charges.items() if n > 1}
    assert len(repeated) <= 4 and all(n == 2 for n in repeated.values()), repeated


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

    @app.task(base=IdempotentTask, idemctl_store=store, idemctl_key="charge:{order}")
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
    assert store.get("charge:o-1") is not None


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
    assert len(keys) == 2 and all(k.startswith("shop.add:") for k in keys)


def test_a_failure_is_retried_by_celery_and_runs_again(app: Any) -> None:
    from idemctl.tasks.celery import IdempotentTask

    store = open_store("memory://")
    runs: list[int] = []

    @app.task(
        base=IdempotentTask, idemctl_store=store, idemctl_key="flaky:{n}", bind=True,
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
    store.claim("slow:1", None, 60)  # another worker's attempt, alive

    @app.task(
        base=IdempotentTask, idemctl_store=store, idemctl_key="slow:{n}",
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

    guard(ship, store=store, key="ship:{order}")
    assert ship.apply(("o-1",)).get() == ship.apply(("o-1",)).get() == "shipped o-1"
    assert runs == ["o-1"]
    assert not isinstance(app.tasks[ship.name], IdempotentTask)  # its base is its own


def test_a_soft_time_limit_is_a_retriable_handler_timeout(app: Any) -> None:
    from celery.exceptions import SoftTimeLimitExceeded

    from idemctl import HandlerTimeout, Status
    from idemctl.tasks.celery import IdempotentTask

    store = open_store("memory://")

    @app.task(base=IdempotentTask, idemctl_store=store, idemctl_key="long:{n}")
    def long(n: int) -> int:
        raise SoftTimeLimitExceeded()

    result = long.apply((1,), throw=False)
    assert isinstance(result.result, HandlerTimeout)
    record = store.get("long:1")
    assert record is not None and record.status is Status.FAILED and record.retriable


def test_a_task_that_always_fails_ends_failed_after_celerys_retries(app: Any) -> None:
    from idemctl.tasks.celery import IdempotentTask

    store = open_store("memory://")
    runs: list[int] = []

    @app.task(
        base=IdempotentTask, idemctl_store=store, idemctl_key="bad:{n}",
        autoretry_for=(ValueError,), max_retries=2, retry_backoff=False, default_retry_delay=0,
    )  # fmt: skip
    def bad(n: int) -> int:
        runs.append(n)
        raise ValueError("declined")

    result = bad.apply((1,), throw=False)
    assert result.state == "FAILURE" and isinstance(result.result, ValueError)
    assert runs == [1, 1, 1]  # the first run and Celery's two retries, each claimed again
    record = store.get("bad:1")
    assert record is not None and record.attempts == 3 and record.retriable  # Celery decides


@pytest.mark.clock
def test_a_killed_workers_task_runs_again_past_its_lease_as_a_takeover(app: Any) -> None:
    """The killed worker's claim (lease live: the redelivery waits, then is re-queued;
    lease passed: it runs, with a new fencing token)."""
    from idemctl import KeyBusy
    from idemctl.tasks.celery import IdempotentTask
    from tests.backends import expire_lease

    store = open_store("memory://")
    killed = store.claim("charge:o-1", None, 600)  # the SIGKILLed worker's attempt
    seen: list[tuple[int, bool]] = []

    @app.task(
        base=IdempotentTask, idemctl_store=store, idemctl_key="charge:{order}", idemctl_wait=0,
    )  # fmt: skip
    def charge(order: str) -> str:
        ctx = current_context()
        seen.append((ctx.fencing_token, ctx.takeover))
        return order

    assert isinstance(charge.apply(("o-1",), throw=False).result, KeyBusy)  # lease live
    assert seen == []
    expire_lease(store, "charge:o-1")
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

    @dramatiq.actor(broker=broker, idemctl_key="charge:{order}", max_retries=3, min_backoff=1)
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
    record = store.get("charge:o-1")
    assert record is not None and record.attempts == 1
