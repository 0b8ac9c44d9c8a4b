"""``idemctl verify``: effectively-once proven on the user's own store and brokers.

It makes a scratch topic (and its dead-letter topic) and a scratch namespace of the store
(``harness.scratch``), produces messages with duplicates (some in other partitions) and
planted poison messages, runs ``idemctl consume`` processes with the recording handler
(``harness.recorder``), and while they run SIGKILLs and restarts them, lets consumers join
and leave, and pauses the store, as asked. When every message is committed it stops them,
reads the ledger and the dead-letter topic, and judges:

- **lost**: a key with no effect although its messages were committed;
- **duplicate effects**: effects beyond the first of a key. In transactional mode
  (PostgreSQL, the ledger row in the key's transaction) none are allowed. Otherwise an
  effect may repeat only when its consumer was SIGKILLed after it and before its key was
  completed, at most ``batch_size`` a kill (what one poll batch holds), or when a store
  fault kept it from being completed;
- **dead letters**: exactly the planted poison keys in the dead-letter topic.

Everything it made is removed at the end, also on Ctrl-C, unless ``keep``. No printing here:
``on_step`` hears what happens and ``on_progress`` gets a ``Progress``; the CLI renders.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from idemctl.errors import ConfigError, KafkaUnavailable, Refused
from idemctl.harness.recorder import LEDGER
from idemctl.harness.scratch import Scratch, option
from idemctl.stores.base import LEASE_RANGE, in_range
from idemctl.urls import split_url

HANDLER = "idemctl.harness.recorder:record"
POISON = "idemctl.harness.recorder.Poison"
SABOTAGE = ("no-claim", "lose")
"""Test-only ways to break the guarantee, so a test can see verify fail: ``no-claim``
runs consume with ``--key offset`` (each delivery its own key: no duplicate is caught);
``lose`` plants messages whose handler returns without recording its effect."""
KAFKA_DEFAULTS = {
    "session.timeout.ms": "6000",
    "heartbeat.interval.ms": "500",
    "auto.offset.reset": "earliest",
}
"""What verify's consumers run with unless --kafka-config says otherwise: a killed member
holds its partitions until its session times out, and 6 s is Apache Kafka's least."""
_CLIENT_PREFIXES = ("security.", "sasl.", "ssl.", "client.", "socket.", "broker.", "api.")
"""--kafka-config settings verify's own clients (admin, producer, reader) take too."""


@dataclass(frozen=True)
class Plan:
    store: str
    brokers: str
    kafka_config: dict[str, str] = field(default_factory=dict)
    default_store: bool = False
    """The store is idemctl's default (not chosen): SQLite in a temporary folder."""
    messages: int = 20_000
    duplicates: float = 0.3
    poison: int = 20
    partitions: int = 6
    consumers: int = 3
    kill_every: float = 2.0
    rebalance: bool = False
    store_pause: float = 0.0
    store_fault_cmd: str | None = None
    transactional: bool = False
    batch_size: int = 1
    lease: float = 5.0
    rate: float = 0.0
    """Messages produced a second (0: as fast as the broker takes them)."""
    timeout: float = 600.0
    keep: bool = False
    run_id: str | None = None
    sabotage: str | None = None

    def check(self) -> None:
        if self.messages < 10:
            raise ConfigError("--messages must be at least 10")
        in_range("--lease", self.lease, LEASE_RANGE)
        if not 0 <= self.duplicates <= 0.9:
            raise ConfigError("--duplicates is a share of --messages, between 0 and 0.9")
        if self.poison < 0 or self.poison > self.messages // 10:
            raise ConfigError("--poison must be between 0 and a tenth of --messages")
        if self.transactional and split_url(self.store).scheme not in ("postgresql", "postgres"):
            raise ConfigError("--transactional needs a postgresql:// store")
        if self.sabotage is not None and self.sabotage not in SABOTAGE:
            raise ConfigError(f"--sabotage must be one of {', '.join(SABOTAGE)}")
        if self.run_id is not None and not self.run_id.replace("-", "").isalnum():
            raise ConfigError("--run-id may hold letters, digits and '-' only")


@dataclass
class Progress:
    phase: str = "prepare"
    produced: int = 0
    handled: int = 0
    kills: int = 0
    rebalances: int = 0
    faults: int = 0


@dataclass
class Fault:
    kind: str
    """``pause`` (SIGSTOP of the local server), ``lock`` (SQLite: an exclusive lock held),
    ``command`` (--store-fault-cmd)."""
    seconds: float
    started: float = 0.0
    ended: float = 0.0
    effects_during: int = 0
    """Effects recorded while the store was out: handlers claimed before it went."""
    consumer_exits: int = 0
    failed_closed: bool = True
    """Whether the outage cost nothing: no key lost, no effect repeated but those it and
    the kills explain (the consumers waited instead of passing messages unfinished)."""


@dataclass
class Effect:
    key: str
    pid: int
    sent: float
    handled: float


@dataclass
class Report:
    run_id: str
    topic: str
    store: str
    mode: str
    guarantee: str
    messages: int
    keys: int
    partitions: int
    consumers: int
    poison_planted: int
    kills: int = 0
    kills_mid_handler: int = 0
    rebalances: int = 0
    consumer_exits: int = 0
    faults: list[Fault] = field(default_factory=list)
    effects: int = 0
    lost: list[str] = field(default_factory=list)
    duplicate_effects: int = 0
    duplicates_allowed: int = 0
    duplicates_unexplained: int = 0
    dead_letters: int = 0
    poison_missing: list[str] = field(default_factory=list)
    dead_letters_unexpected: list[str] = field(default_factory=list)
    lag_left: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    seconds: float = 0.0
    throughput: float = 0.0
    kept: bool = False
    timed_out: bool = False

    @property
    def problems(self) -> list[str]:
        found = []
        if self.timed_out:
            found.append(f"not drained in time: {self.lag_left} message(s) not committed")
        if self.lost:
            found.append(f"{len(self.lost)} key(s) lost")
        if self.duplicate_effects > self.duplicates_allowed:
            found.append(
                f"{self.duplicate_effects} duplicate effect(s), the guarantee allows "
                f"{self.duplicates_allowed}"
            )
        if self.poison_missing:
            found.append(f"{len(self.poison_missing)} poison key(s) not dead-lettered")
        if self.dead_letters_unexpected:
            found.append(f"{len(self.dead_letters_unexpected)} good key(s) dead-lettered")
        return found

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["lost"] = len(self.lost)
        document["lost_keys"] = self.lost[:100]
        document["poison_missing"] = self.poison_missing[:100]
        document["dead_letters_unexpected"] = self.dead_letters_unexpected[:100]
        document["problems"] = self.problems
        document["ok"] = self.ok
        return document


def guarantee_of(plan: Plan) -> tuple[str, str]:
    """The mode under test and what it promises."""
    if plan.transactional:
        return "transactional", "effect and completion commit together: no duplicate effect"
    return "at-least-once effects", (
        f"an effect repeats only when a SIGKILL lands between it and its key's completion: "
        f"at most {plan.batch_size} a kill (--batch-size)"
    )


class Verdict(NamedTuple):
    duplicate_effects: int
    duplicates_allowed: int
    duplicates_unexplained: int
    kills_mid_handler: int


def judge(
    effects: list[Effect],
    killed: dict[int, float],
    faults: list[Fault],
    plan: Plan,
) -> Verdict:
    """The duplicate effects, those the guarantee allows, the unexplained ones and the kills
    that landed mid-handler, for the ledger's ``effects`` in the order written, ``killed`` PID ->
    when it was SIGKILLed (wall clock). Every effect of a key but its last was repeated: it is
    explained when its process was killed after it (at most ``batch_size`` a kill), or, out
    of transactional mode, when it was recorded while a store fault could keep its key from
    being completed (from a lease before the fault to its end)."""
    by_key: dict[str, list[Effect]] = {}
    for effect in effects:
        by_key.setdefault(effect.key, []).append(effect)
    cut_off: Counter[int] = Counter()
    by_fault = unexplained = duplicates = 0
    for repeated in by_key.values():
        for effect in repeated[:-1]:
            duplicates += 1
            if effect.pid in killed and effect.handled <= killed[effect.pid]:
                cut_off[effect.pid] += 1
            elif any(f.started - plan.lease <= effect.handled <= f.ended for f in faults):
                by_fault += 1
            else:
                unexplained += 1
    if plan.transactional:
        return Verdict(duplicates, 0, duplicates, len(cut_off))
    over = sum(max(0, n - plan.batch_size) for n in cut_off.values())
    allowed = sum(min(n, plan.batch_size) for n in cut_off.values()) + by_fault
    return Verdict(duplicates, allowed, unexplained + over, len(cut_off))


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


@dataclass
class _Messages:
    """What verify produces: each key once, its duplicates, and the poison among them."""

    keys: list[str]
    poison: set[str]
    dropped: set[str]
    order: list[tuple[str, bool]]
    """(key, whether this copy goes to another partition than the key's first)."""

    @classmethod
    def plan(cls, plan: Plan, run: str) -> _Messages:
        rng = random.Random(run)
        unique = plan.messages - int(plan.messages * plan.duplicates)
        keys = [f"verify-{run}-{i}" for i in range(unique)]
        poison = set(rng.sample(keys, plan.poison))
        dropped = set()
        if plan.sabotage == "lose":
            dropped = {k for i, k in enumerate(keys) if i % 50 == 7 and k not in poison}
        order = [(k, False) for k in keys]
        order += [(rng.choice(keys), i % 2 == 1) for i in range(plan.messages - unique)]
        rng.shuffle(order)
        return cls(keys, poison, dropped, order)

    @property
    def expected(self) -> set[str]:
        """Keys that must end with an effect."""
        return set(self.keys) - self.poison


class _Ledger:
    """The recording handler's ledger: a file read as it grows, or (transactional mode) the
    PostgreSQL table, read on a store kept open for the run."""

    def __init__(self, folder: Path, scratch: Scratch, transactional: bool) -> None:
        self.table = scratch.ledger_table if transactional else None
        self.path = folder / "ledger.txt"
        self.path.touch()
        self._store: Any = scratch.store() if self.table else None  # closed by __exit__
        self._read = 0
        self._effects: list[Effect] = []

    def __enter__(self) -> _Ledger:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._store is not None:
            self._store.close()

    @property
    def env(self) -> str:
        return f"table:{self.table}" if self.table else f"file:{self.path}"

    def _sql(self, sql: str) -> list[tuple[Any, ...]]:
        with self._store.connection() as conn:
            return conn.execute(sql).fetchall()  # type: ignore[no-any-return]

    def effects(self) -> list[Effect]:
        """Every effect recorded, in the order written."""
        if self.table:
            rows = self._sql(f"SELECT key, pid, sent, handled FROM {self.table} ORDER BY n")  # noqa: S608 - our table
            return [Effect(k, int(p), float(s), float(h)) for k, p, s, h in rows]
        with self.path.open("rb") as f:
            f.seek(self._read)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        self._read += len(complete)
        for line in complete.decode().splitlines():
            key, pid, sent, handled, _token = line.split()
            self._effects.append(Effect(key, int(pid), float(sent), float(handled)))
        return self._effects

    def count(self) -> int:
        if self.table:
            return int(self._sql(f"SELECT count(*) FROM {self.table}")[0][0])  # noqa: S608
        return len(self.effects())


class _Consumers:
    """The ``idemctl consume`` processes, each in a session of its own, logging to a file."""

    def __init__(self, plan: Plan, scratch: Scratch, topic: str, ledger: _Ledger, folder: Path):
        self.plan, self.folder = plan, folder
        # The store URL and Kafka settings (passwords among them) reach the processes
        # through their environment, named by a config file: never on a command line,
        # which anyone on the machine can read.
        kafka = {**KAFKA_DEFAULTS, **plan.kafka_config}
        secrets = {"IDEMCTL_STORE": scratch.url}
        secrets |= {f"IDEMCTL_VERIFY_KAFKA_{i}": v for i, v in enumerate(kafka.values())}
        config = {"kafka": {k: f"${{IDEMCTL_VERIFY_KAFKA_{i}}}" for i, k in enumerate(kafka)}}
        (folder / "idemctl.yaml").write_text(json.dumps(config, indent=2))  # JSON is YAML
        self.command = [
            sys.executable, "-m", "idemctl", "--config", str(folder / "idemctl.yaml"),
            "consume", "--brokers", plan.brokers, "--topic", topic, "--group", topic,
            "--handler", HANDLER, "--permanent-errors", POISON, "--dlq-topic", f"{topic}.dlq",
            "--batch-size", str(plan.batch_size), "--lease", f"{plan.lease}s",
            "--backoff", "200ms", "--join-timeout", "0",
        ]  # fmt: skip
        if plan.transactional:
            self.command.append("--transactional")
        if plan.sabotage == "no-claim":
            self.command += ["--key", "offset"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("IDEMCTL_")}
        self.env = {**env, **secrets, LEDGER: ledger.env, "PYTHONUNBUFFERED": "1"}
        self.running: list[subprocess.Popen[bytes]] = []
        self.extra: subprocess.Popen[bytes] | None = None
        self.leaving: list[subprocess.Popen[bytes]] = []
        self.killed: dict[int, float] = {}
        self.exits = self.rebalances = 0
        self._started = 0
        self.logs: dict[int, int] = {}
        """PID -> the number of its log file."""
        self.spawned: list[subprocess.Popen[bytes]] = []
        """Every process started, recorded before Ctrl-C can land: kill_all's list."""

    def start(self) -> subprocess.Popen[bytes]:
        """A consume process. It is started from verify's main thread, and on Linux gets
        SIGTERM (drain, exit) when that thread dies: a verify killed outright leaves no
        consumer running for ever behind it."""
        self._started += 1
        log_path = self.folder / f"consumer-{self._started}.log"
        with _interrupts_deferred(), log_path.open("wb") as log:
            # preexec_fn only calls prctl, looked up beforehand: no import, lock or log in
            # the child that another thread of ours could hold at the fork
            proc = subprocess.Popen(  # noqa: S603 - our own argv
                self.command, cwd=self.folder, env=self.env, stdout=log, stderr=log,
                stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=_term_with_parent,  # noqa: PLW1509
            )  # fmt: skip
            self.logs[proc.pid] = self._started
            self.spawned.append(proc)
        return proc

    def start_all(self) -> None:
        self.running = [self.start() for _ in range(self.plan.consumers)]

    def kill_one(self, rng: random.Random) -> None:
        index = rng.randrange(len(self.running))
        victim = self.running[index]
        self.killed[victim.pid] = time.time()
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        self.running[index] = self.start()

    def rebalance(self) -> None:
        """A consumer joins, or the one that joined leaves (SIGTERM: it drains first)."""
        if self.extra is None:
            self.extra = self.start()
        else:
            self.extra.send_signal(signal.SIGTERM)
            self.leaving.append(self.extra)
            self.extra = None
        self.rebalances += 1

    def watch(self) -> None:
        """Restart a consumer that exited by itself; a usage error (exit 2) stops verify."""
        for i, proc in enumerate(self.running):
            rc = proc.poll()
            if rc is None:
                continue
            self.exits += 1
            if rc == 2:
                raise ConfigError(f"a consume process refused to start:\n{self.log_tail(proc)}")
            self.running[i] = self.start()

    def log_tail(self, proc: subprocess.Popen[bytes], lines: int = 15) -> str:
        path = self.folder / f"consumer-{self.logs[proc.pid]}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    @property
    def every(self) -> list[subprocess.Popen[bytes]]:
        return [*self.running, *([self.extra] if self.extra else []), *self.leaving]

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM (drain and commit), then SIGKILL for any still there after ``grace``."""
        procs = self.every
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def kill_all(self) -> None:
        for proc in self.spawned:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Ctrl-C and SIGTERM (verify's own handlers) wait until the block ends. A process
    started in it is recorded before they land: Popen waits for the child's exec, and an
    interrupt raised there or before the record would leave a consumer running unseen,
    writing dead letters to a topic the clean-up has just deleted."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, _frame: caught.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for signum in dict.fromkeys(caught):
            signal.raise_signal(signum)  # now, to the handler that was there


_PRCTL = None
if sys.platform == "linux":
    import ctypes

    with suppress(OSError, AttributeError):
        _PRCTL = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not in the child


def _term_with_parent() -> None:
    """In the child, before exec: SIGTERM when the thread that started it dies (Linux's
    PR_SET_PDEATHSIG; a no-op elsewhere)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)


class _Kafka:
    """verify's own Kafka clients: topics, producing, reading offsets and dead letters."""

    def __init__(self, plan: Plan, topic: str) -> None:
        from confluent_kafka.admin import AdminClient

        self.plan, self.topic, self.dlq = plan, topic, f"{topic}.dlq"
        own = {k: v for k, v in plan.kafka_config.items() if k.startswith(_CLIENT_PREFIXES)}
        self.config = {"bootstrap.servers": plan.brokers, **own}
        self.admin = AdminClient({**self.config, "log_level": 0})
        self.ends: dict[int, int] = {}
        """Partition -> offset after the last message verify produced there."""

    def existing(self) -> set[str]:
        from confluent_kafka import KafkaException

        try:
            return set(self.admin.list_topics(timeout=10).topics)
        except KafkaException as exc:
            raise KafkaUnavailable(
                f"cannot reach the brokers at {self.plan.brokers}: {exc}"
            ) from None

    def create(self) -> None:
        from confluent_kafka.cimpl import NewTopic

        new = [NewTopic(self.topic, self.plan.partitions, 1), NewTopic(self.dlq, 1, 1)]
        for future in self.admin.create_topics(new, operation_timeout=30).values():
            future.result(60)

    def remove(self, group: str) -> dict[str, str]:
        """Delete the run's topics and group; what is still listed after a minute of
        trying again, with why (a slow broker, or a client that wrote to it once more)."""
        left, why = {self.topic, self.dlq}, {}
        deadline = time.monotonic() + 60
        while left:
            deleting = self.admin.delete_topics(sorted(left), operation_timeout=30)
            for name, future in deleting.items():
                try:
                    future.result(60)
                except Exception as exc:  # gone already, or said below
                    why[name] = str(exc)
            left &= self.existing()
            if left and time.monotonic() > deadline:
                break
            if left:
                time.sleep(0.5)
        for future in self.admin.delete_consumer_groups([group]).values():
            with suppress(Exception):  # never formed, or the broker keeps no groups
                future.result(30)
        return {name: why.get(name, "still listed after its deletion") for name in left}

    def produce(self, messages: _Messages, progress: Progress, stop: threading.Event) -> None:
        from confluent_kafka import Producer

        producer = Producer({**self.config, "enable.idempotence": True, "linger.ms": 5})

        failed: list[Any] = []

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                failed.append(err)
                return
            self.ends[msg.partition()] = max(self.ends.get(msg.partition(), 0), msg.offset() + 1)
            progress.produced += 1

        started = time.monotonic()
        for i, (key, elsewhere) in enumerate(messages.order):
            if stop.is_set():
                break
            if self.plan.rate:
                time.sleep(max(0.0, started + i / self.plan.rate - time.monotonic()))
            # every copy of a key alike, as a producer's retry sends it
            body: dict[str, Any] = {"key": key, "cents": 100}
            if key in messages.poison:
                body["poison"] = True
            if key in messages.dropped:
                body["drop"] = True
            while True:
                try:
                    producer.produce(
                        self.topic,
                        key=(key + "-elsewhere" if elsewhere else key).encode(),
                        value=json.dumps(body).encode(),
                        headers=[("idempotency-key", key.encode())],
                        on_delivery=delivered,
                    )
                    break
                except BufferError:  # the local queue is full: let it drain
                    producer.poll(0.1)
            producer.poll(0)
        if stop.is_set():  # interrupted: what is queued would land after the clean-up
            producer.purge()
            producer.flush(5)
            return
        if producer.flush(60) or failed:
            why = f": {failed[0]}" if failed else ""
            raise KafkaUnavailable(
                f"the brokers at {self.plan.brokers} did not take every message{why}"
            )

    @contextmanager
    def offsets_reader(self, group: str) -> Iterator[Callable[[], int]]:
        """A function that gives the messages produced and not yet committed by ``group``."""
        from confluent_kafka import Consumer, TopicPartition

        reader = Consumer({**self.config, "group.id": group, "enable.auto.commit": False})
        try:

            def lag() -> int:
                tps = [TopicPartition(self.topic, p) for p in self.ends]
                done = {tp.partition: tp.offset for tp in reader.committed(tps, timeout=10)}
                return sum(end - max(done.get(p, 0), 0) for p, end in self.ends.items())

            yield lag
        finally:
            reader.close()

    def dead_letter_keys(self, expect: int, timeout: float = 30.0) -> list[str]:
        """The idempotency keys of the dead letters: until ``expect`` are read and nothing
        more comes for a second, or ``timeout``."""
        from confluent_kafka import Consumer, TopicPartition

        reader = Consumer(
            {**self.config, "group.id": f"{self.topic}-reader", "enable.auto.commit": False}
        )
        reader.assign([TopicPartition(self.dlq, 0, 0)])
        keys: list[str] = []
        deadline = time.monotonic() + timeout
        quiet_since = time.monotonic()
        try:
            while time.monotonic() < deadline:
                batch = [m for m in reader.consume(500, timeout=0.2) if m.error() is None]
                for m in batch:
                    key = dict(m.headers() or []).get("idempotency-key")
                    keys.append(key.decode() if isinstance(key, bytes) else str(key))
                if batch:
                    quiet_since = time.monotonic()
                elif len(keys) >= expect and time.monotonic() - quiet_since > 1.0:
                    break
        finally:
            reader.close()
        return keys


def listening_pids(port: int) -> list[int]:
    """The local processes listening on TCP ``port`` (Linux /proc), with their children:
    PostgreSQL serves each connection from a child of the one listening."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with suppress(OSError), open(table) as f:
            for line in list(f)[1:]:
                cols = line.split()
                if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == "0A":
                    inodes.add(cols[9])
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        found.add(int(pid))
    children = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with suppress(OSError), open(f"/proc/{pid}/stat") as f:
            parent = int(f.read().rsplit(")", 1)[1].split()[1])
            if parent in found:
                children.add(int(pid))
    return sorted(found | children)


class _StoreFault:
    """Takes the store away for ``plan.store_pause`` seconds: the user's command, SIGSTOP
    of a server listening on this machine, or (SQLite) an exclusive lock on the file."""

    def __init__(self, plan: Plan, scratch: Scratch) -> None:
        self.plan, self.scratch = plan, scratch
        self.kind = (
            "command" if plan.store_fault_cmd else "lock" if scratch.scheme == "sqlite" else "pause"
        )
        if plan.store_fault_cmd and "{action}" not in plan.store_fault_cmd:
            raise ConfigError(
                "--store-fault-cmd must hold {action}, run as 'stop' then 'start', e.g. "
                "'docker {action} redis'"
            )
        self.pids: list[int] = []
        if self.kind == "pause":
            parts = split_url(scratch.url)
            host = parts.hostname
            port = parts.port
            if scratch.scheme == "dynamodb":
                endpoint = option(scratch.url, "endpoint_url")
                parts = split_url(endpoint) if endpoint else parts
                host, port = parts.hostname, parts.port
            if host not in ("127.0.0.1", "localhost", "::1") or port is None:
                raise ConfigError(
                    "--store-pause on a store that is not on this machine needs "
                    "--store-fault-cmd 'COMMAND {action}'"
                )
            self.pids = listening_pids(port)
            if not self.pids:
                raise ConfigError(
                    f"--store-pause: no process of yours listens on port {port}; give "
                    "--store-fault-cmd 'COMMAND {action}'"
                )

    def run(self, fault: Fault) -> None:
        fault.started = time.time()
        try:
            if self.kind == "lock":
                self._lock(fault.seconds)
            elif self.kind == "pause":
                for pid in self.pids:
                    with suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGSTOP)
                try:
                    time.sleep(fault.seconds)
                finally:
                    for pid in self.pids:
                        with suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGCONT)
            else:
                assert self.plan.store_fault_cmd is not None
                self._command("stop")
                try:
                    time.sleep(fault.seconds)
                finally:
                    self._command("start")
        finally:
            fault.ended = time.time()

    def _lock(self, seconds: float) -> None:
        import sqlite3

        assert self.scratch.path is not None
        conn = sqlite3.connect(self.scratch.path, timeout=30, isolation_level=None)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            time.sleep(seconds)
            conn.execute("ROLLBACK")
        finally:
            conn.close()

    def _command(self, action: str) -> None:
        assert self.plan.store_fault_cmd is not None
        command = self.plan.store_fault_cmd.replace("{action}", shlex.quote(action))
        done = subprocess.run(command, shell=True, capture_output=True, timeout=120, check=False)  # noqa: S602 - the user's own command
        if done.returncode != 0:
            raise ConfigError(
                f"--store-fault-cmd {action} exited {done.returncode}: "
                f"{done.stderr.decode(errors='replace').strip()[-300:]}"
            )


REBALANCE_EVERY = 5.0
"""Seconds between a consumer joining and leaving, under --rebalance (the first joins 1 s
into the run)."""
STALLED = 15.0
"""Seconds without a message handled after which a kill or a rebalance that is due goes
ahead all the same."""


class _Chaos:
    """When to kill a consumer (every ``kill_every`` seconds) and, under --rebalance, when
    one joins or leaves (1 s in, then every REBALANCE_EVERY). Either waits until a message
    was handled since the last of them, or STALLED seconds have gone by without one. Each
    makes the group rebalance: where that takes longer than ``kill_every`` (a loaded
    machine), kills on the clock alone would keep the group from ever settling. After
    STALLED seconds with nothing handled, the chaos goes on all the same: a run without
    progress is not held back by verify."""

    def __init__(self, started: float, kill_every: float, rebalance: bool) -> None:
        self.every = {"kill": kill_every, "rebalance": REBALANCE_EVERY}
        self.next = {
            "kill": started + kill_every if kill_every > 0 else float("inf"),
            "rebalance": started + 1.0 if rebalance else float("inf"),
        }
        self.handled, self.last = 0, started  # at the last kill or rebalance

    def due(self, now: float, handled: int) -> list[str]:
        """What to do at ``now`` with ``handled`` messages handled: "kill", "rebalance"."""
        acts = []
        for act, at in self.next.items():
            if now >= at and (handled > self.handled or now - self.last >= STALLED):
                acts.append(act)
                self.next[act] = now + self.every[act]
                self.handled, self.last = handled, now
        return acts


def run_verify(
    plan: Plan,
    on_step: Callable[[str], None] = lambda step: None,
    on_progress: Callable[[Progress], None] = lambda progress: None,
) -> Report:
    """Run the proof; ``on_step`` hears each step, ``on_progress`` the counts, every
    quarter second. KeyboardInterrupt (Ctrl-C) stops it, and what it made is removed."""
    plan.check()
    return _Run(plan, on_step, on_progress).run()


class _Run:
    def __init__(
        self,
        plan: Plan,
        on_step: Callable[[str], None],
        on_progress: Callable[[Progress], None],
    ) -> None:
        self.plan, self.on_step, self.on_progress = plan, on_step, on_progress
        self.id = plan.run_id or uuid.uuid4().hex[:8]
        self.topic = f"idemctl-verify-{self.id}"
        self.scratch = Scratch(plan.store, self.id, plan.default_store)
        self.kafka = _Kafka(plan, self.topic)
        if {self.topic, self.kafka.dlq} & self.kafka.existing():
            raise Refused(
                f"topic {self.topic} already exists: verify only runs on topics it creates"
            )
        self.scratch.refuse_if_used()
        self.fault = _StoreFault(plan, self.scratch) if plan.store_pause > 0 else None
        self.messages = _Messages.plan(plan, self.id)
        self.progress = Progress()
        mode, guarantee = guarantee_of(plan)
        self.report = Report(
            self.id, self.topic, self.scratch.shown, mode, guarantee, plan.messages,
            len(self.messages.expected), plan.partitions, plan.consumers,
            len(self.messages.poison), kept=plan.keep,
        )  # fmt: skip
        self.faults: list[Fault] = []
        self.folder = Path(tempfile.mkdtemp(prefix=f"idemctl-verify-{self.id}-"))
        self.made: list[str] = []
        self.stop_producing = threading.Event()
        self._fault_thread: threading.Thread | None = None
        self._producer: threading.Thread | None = None
        self._exits_before = 0

    def phase(self, name: str) -> None:
        self.progress.phase = name
        self.on_progress(self.progress)

    def run(self) -> Report:
        consumers: _Consumers | None = None
        try:
            with ExitStack() as stack:
                self.kafka.create()
                self.made.append("topics")
                self.on_step(
                    f"topic {self.topic} ({self.plan.partitions} partitions), {self.kafka.dlq}"
                )
                self.made.append("store")
                self.scratch.provision(self.plan.transactional)
                self.on_step(f"scratch store {self.scratch.shown}")
                ledger = stack.enter_context(
                    _Ledger(self.folder, self.scratch, self.plan.transactional)
                )
                consumers = _Consumers(self.plan, self.scratch, self.topic, ledger, self.folder)
                stack.callback(consumers.kill_all)
                consumers.start_all()
                self.phase("consume")
                r = self.report
                self.on_step(f"{self.plan.consumers} consume processes; {r.mode}: {r.guarantee}")
                self._drive(consumers, ledger)
                self.on_step(f"consumers stopped after {self.report.seconds:.1f}s")
                self.phase("check")
                self._judge(ledger.effects(), consumers)
            return self.report
        finally:
            self.stop_producing.set()
            if self._producer is not None:
                self._producer.join(15)  # no message sent after the topics are deleted
            self._clean()

    def _produce(self, failed: list[BaseException]) -> None:
        try:
            self.kafka.produce(self.messages, self.progress, self.stop_producing)
        except BaseException as exc:  # raised again by the main thread
            failed.append(exc)

    def _drive(self, consumers: _Consumers, ledger: _Ledger) -> None:
        """Produce, and kill, rebalance and fault as asked, until every message produced is
        committed (or the time is up); then stop the consumers."""
        plan = self.plan
        failed: list[BaseException] = []
        producer = self._producer = threading.Thread(
            target=self._produce, args=(failed,), daemon=True
        )
        started = time.monotonic()
        producer.start()
        rng = random.Random(f"{self.id}-kills")
        chaos = _Chaos(started, plan.kill_every, plan.rebalance)
        fault_at = started + 3.0 if self.fault is not None else float("inf")
        with self.kafka.offsets_reader(self.topic) as lag:
            while producer.is_alive() or lag() > 0:
                now = time.monotonic()
                if now - started > plan.timeout:
                    self.report.timed_out = True
                    break
                if failed:
                    raise failed[0]
                consumers.watch()
                for act in chaos.due(now, self.progress.handled):
                    if act == "kill":
                        consumers.kill_one(rng)
                        self.progress.kills = len(consumers.killed)
                    else:
                        consumers.rebalance()
                        self.progress.rebalances = consumers.rebalances
                if self.fault is not None and now >= fault_at:
                    fault_at = float("inf")
                    self._start_fault(self.fault, consumers)
                if not self._faulting(consumers):  # the store may not answer meanwhile
                    with suppress(Exception):  # a count for the progress view only
                        self.progress.handled = ledger.count()
                self.on_progress(self.progress)
                time.sleep(0.25)
            if self._fault_thread is not None:
                self._fault_thread.join()
            self.report.seconds = time.monotonic() - started
            self.phase("drain")
            consumers.stop()
            self.report.lag_left = lag() if self.kafka.ends else 0

    def _start_fault(self, fault: _StoreFault, consumers: _Consumers) -> None:
        self.faults.append(Fault(fault.kind, self.plan.store_pause))
        self.progress.faults += 1
        self.on_step(f"store fault: {fault.kind} for {self.plan.store_pause:g}s")
        self._exits_before = consumers.exits
        self._fault_thread = threading.Thread(
            target=fault.run, args=(self.faults[-1],), daemon=True
        )
        self._fault_thread.start()

    def _faulting(self, consumers: _Consumers) -> bool:
        """Whether the store is out now (counting the consumers' exits meanwhile)."""
        if self._fault_thread is None or not self._fault_thread.is_alive():
            return False
        self.faults[-1].consumer_exits = consumers.exits - self._exits_before
        return True

    def _judge(self, effects: list[Effect], consumers: _Consumers) -> None:
        report, plan, messages = self.report, self.plan, self.messages
        report.kills = len(consumers.killed)
        report.rebalances = consumers.rebalances
        report.consumer_exits = consumers.exits
        report.faults = self.faults
        for f in self.faults:
            f.effects_during = sum(1 for e in effects if f.started <= e.handled <= f.ended)
        report.effects = len(effects)
        report.lost = sorted(messages.expected - {e.key for e in effects})
        (
            report.duplicate_effects,
            report.duplicates_allowed,
            report.duplicates_unexplained,
            report.kills_mid_handler,
        ) = judge(effects, consumers.killed, self.faults, plan)
        for f in self.faults:
            f.failed_closed = not report.lost and report.duplicates_unexplained == 0
        first: dict[str, Effect] = {}
        for e in effects:
            first.setdefault(e.key, e)
        latencies = [(e.handled - e.sent) * 1000 for e in first.values()]
        report.p50_ms = percentile(latencies, 0.50)
        report.p99_ms = percentile(latencies, 0.99)
        report.throughput = plan.messages / report.seconds if report.seconds else 0.0
        dead = self.kafka.dead_letter_keys(expect=len(messages.poison))
        report.dead_letters = len(dead)
        report.poison_missing = sorted(messages.poison - set(dead))
        report.dead_letters_unexpected = sorted(set(dead) - messages.poison)

    def _clean(self) -> None:
        if self.plan.keep:
            self.on_step(
                f"kept: topic {self.topic}, store {self.scratch.shown}, logs in {self.folder}"
            )
            return
        self.phase("clean up")
        kept = self.kafka.remove(self.topic) if "topics" in self.made else {}
        for topic, why in kept.items():
            self.on_step(f"could not delete topic {topic}: {why}")
        if "store" in self.made:
            self.scratch.remove()
        for path in self.folder.iterdir():
            path.unlink()
        self.folder.rmdir()
        self.on_step(f"removed the scratch {'store' if kept else 'topics and store'}")
