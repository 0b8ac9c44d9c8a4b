"""The shop of ``examples/tasks/<queue>_app.py``, driven as a black box: its broker, store,
ledger and workers (real processes, SIGKILLed for real), and the kill scenario every queue
is held to."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from idemctl import open_store, operate
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
stream and its consumer group, arq's a sorted set and a key per job in progress
(``Shop.drained``)."""


class Shop:
    """The example's broker, store, ledger and workers."""

    def __init__(
        self,
        folder: Path,
        redis: RedisServer,
        rabbit: RabbitServer | None = None,
        queue: str = "celery",
        fenced: bool = False,
        **env: str,
    ) -> None:
        """``examples/tasks/<queue>_app.py``, its store on ``redis``; its broker too, or
        ``rabbit``. ``fenced``: its charges written to a fenced ledger (a SQLite file,
        ``examples/tasks/ledger.py``) instead of appended to a text file."""
        self.folder, self.redis, self.rabbit, self.queue = folder, redis, rabbit, queue
        self.ledger = folder / ("ledger.db" if fenced else "ledger.txt")
        if fenced:
            from examples.tasks.ledger import create

            create(str(self.ledger))
        else:
            self.ledger.touch()
        base = f"redis://127.0.0.1:{redis.port}"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("IDEMCTL_")},
            "BROKER_URL": f"{base}/0" if rabbit is None else rabbit.url,
            # arq's redis-py (below 6) is not the Redis store's: its store is SQLite.
            "IDEMCTL_STORE": f"sqlite:///{folder}/store.db" if queue == "arq" else f"{base}/1",
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
        """How many times each order was charged (the fenced ledger: its rows)."""
        if self.ledger.suffix != ".db":
            return Counter(self.ledger.read_text().split())
        import sqlite3
        from contextlib import closing

        with closing(sqlite3.connect(self.ledger, timeout=60)) as connection:
            return Counter(order for (order,) in connection.execute("SELECT order_id FROM charges"))

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
            if self.queue == "arq":  # a job leaves arq's queue when it finishes
                return client.zcard("arq:queue") == 0 and not client.keys("arq:in-progress:*")
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


def charge_through_a_kill(shop: Shop) -> None:
    """300 orders sent twice, the worker SIGKILLed once a third are charged and started
    again, 50 sent a third time: every order charged, a repeat only where the kill cut in
    (at most the worker's 4 tasks at a time; none with a fenced ledger, where a takeover's
    charge replaces the row its killed predecessor wrote)."""
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
        shop.settle(orders, 300)  # rq: a killed job is found abandoned 60 s after its last beat
    finally:
        shop.stop()
    charges = shop.charges()
    assert set(charges) == set(orders)
    repeated = {order: n for order, n in charges.items() if n > 1}
    assert len(repeated) <= 4 and all(n == 2 for n in repeated.values()), repeated
    if shop.ledger.suffix == ".db":  # and not one charge refused (FenceConflict, StaleFence)
        assert "Fence" not in shop.logs(tail=None), shop.logs()
    # What an operator sees (idemctl tasks): the queue's charge task, every key done.
    with operate.open_target(shop.env["IDEMCTL_STORE"]) as target:
        (counts,) = operate.tasks(target, shop.queue)
    assert counts.task.endswith("charge") and counts.completed == 300, counts
    assert counts.in_progress == counts.failed == 0, counts
