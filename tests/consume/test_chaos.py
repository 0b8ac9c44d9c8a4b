"""Chaos: three `idemctl consume --transactional` processes in one group on PostgreSQL,
a topic with duplicates (some in other partitions) and planted poison messages, and a
random consumer SIGKILLed and restarted each time the group committed another fifteenth of
the topic (2 seconds apart at least) until the topic is drained. Then
the ledger holds exactly one row per key, none missing, and the dead-letter topic holds
exactly the poison messages."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from idemctl import open_store
from tests.backends import QUICK_FAMILIES, unique_schema
from tests.consume.test_consume import committed, produce, read_all
from tests.servers import KafkaBroker

REPO = Path(__file__).resolve().parents[2]
MESSAGES = int(os.environ.get("IDEMCTL_CHAOS_MESSAGES", "8000"))
"""The PostgreSQL chaos run's topic: its kills follow the group's progress (a fifteenth of
the topic between two), so a smaller topic has as many kills and rebalances, for less
work between them (20,000 cost 2.5 times the CPU for the same 15 kills)."""
PARTITIONS = 6
KILL_EVERY = 2.0
# Without a kill limit, a kill waits for the group to commit 1/KILLS of the topic since the
# last one: as many rebalances on a slow machine as on a fast one. Killing at a fixed pace
# instead left a loaded machine (CI) rebalancing most of the time, not drained after 420 s.
KILLS = 15
DEADLINE = 420.0
# The hang bound lies past the test's own DEADLINE: on a loaded machine the chaos runs long
# (pyproject's 300 s cut one off at 300 s in CI, its own deadline still ahead).
pytestmark = pytest.mark.timeout(DEADLINE + 180)


def slow_payments(folder: Path, seconds: float) -> str:
    """Writes a module whose handler sleeps ``seconds`` before the demo's charge, so that
    kills land mid-run; returns the handler's path."""
    (folder / "slow_payments.py").write_text(
        "import time\nfrom payments import charge as fast\n\n\n"
        f"def charge(event, ctx):\n    time.sleep({seconds})\n    return fast(event, ctx)\n"
    )
    return "slow_payments:charge"


def ledger_env(ledger: Path, folder: Path) -> dict[str, str]:
    """The environment of examples/payments.py charging unfenced, a line of ``ledger`` a
    charge: these runs count the repeats a kill may leave (the fenced ledger is the demo's)."""
    path = os.pathsep.join([str(REPO), str(REPO / "examples"), str(folder)])
    return {**os.environ, "IDEMCTL_DEMO_LEDGER": str(ledger), "IDEMCTL_DEMO_UNFENCED": "1",
            "PYTHONPATH": path}  # fmt: skip


def consumers_under_chaos(
    broker: KafkaBroker, url: str, topic: str, group: str, handler: str, *options: str,
    cwd: Path, env: dict[str, str], rng: random.Random, done: Callable[[], bool],
    total: int, kill_limit: int | None = None,
) -> int:  # fmt: skip
    """Three `idemctl consume` processes on a topic of ``total`` messages; every KILL_EVERY
    seconds a random one is SIGKILLed and started again (``kill_limit`` times at most;
    without a limit, only once the group committed ``total / KILLS`` more messages since
    the last kill), until ``done()``. Then they get SIGTERM (drain and exit: what each
    holds is finished), each stopped by its PID.
    Returns the number of kills."""
    # A killed member holds its partitions until its session times out: keep that short.
    # Offsets committed every 500 ms: the kills follow the group's progress closely.
    config = broker.client_config(
        **{"session.timeout.ms": 2000, "heartbeat.interval.ms": 300,
           "auto.commit.interval.ms": 500}
    )  # fmt: skip
    kafka = [x for k, v in config.items() if k != "bootstrap.servers"
             for x in ("--kafka-config", f"{k}={v}")]  # fmt: skip
    command = [
        sys.executable, "-m", "idemctl", "--store", url, "consume", "--brokers",
        broker.bootstrap, "--topic", topic, "--group", group, "--handler", handler,
        "--backoff", "200ms", *options, *kafka,
    ]  # fmt: skip

    def start() -> subprocess.Popen[bytes]:
        quiet = subprocess.DEVNULL
        return subprocess.Popen(command, cwd=cwd, env=env, stdout=quiet, stderr=quiet)

    consumers = [start() for _ in range(3)]
    kills = 0
    started = time.monotonic()
    offsets = 0
    step = max(total // KILLS, 1)
    try:
        while not done():
            assert time.monotonic() - started < DEADLINE, f"not drained after {DEADLINE}s"
            time.sleep(KILL_EVERY)
            if kill_limit is not None and kills >= kill_limit:
                continue  # the group drains by itself now
            if kill_limit is None:
                now = sum(o for o in committed(broker, topic, group, PARTITIONS).values() if o > 0)
                if now < offsets + step:
                    continue
                offsets = now
            victim = rng.randrange(len(consumers))
            os.kill(consumers[victim].pid, signal.SIGKILL)
            consumers[victim].wait()
            kills += 1
            consumers[victim] = start()
        print(f"drained in {time.monotonic() - started:.0f}s with {kills} kills")
    finally:
        for c in consumers:
            if c.poll() is None:
                c.send_signal(signal.SIGTERM)
        for c in consumers:
            try:
                c.wait(30)
            except subprocess.TimeoutExpired:
                c.kill()
                c.wait()
    return kills


def test_killed_consumers_lose_nothing_and_book_nothing_twice(
    kafka_broker: KafkaBroker, postgres_server: Any, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    topic, group = f"chaos-{tag}", f"chaos-{tag}"
    kafka_broker.create_topic(topic, partitions=PARTITIONS)
    kafka_broker.create_topic(f"{topic}.dlq", partitions=1)
    url = postgres_server.url(schema=unique_schema())
    with open_store(url) as store:
        store.provision()
    with postgres_server.connect() as conn:
        conn.execute(
            f"CREATE TABLE ledger_{tag} "
            "(key text, account text, cents bigint, fencing_token bigint)"
        )
    rng = random.Random(7)
    unique = int(MESSAGES * 0.7)
    keys = [f"pay-{i}" for i in range(unique)]
    poison = set(rng.sample(keys, 25))
    messages = []
    for k in keys:
        body: dict[str, Any] = (
            {"poison": True} if k in poison else {"account": "acc-1", "cents": 100}
        )
        messages.append({"value": body, "idem": k, "kkey": k.encode()})
    for i in range(MESSAGES - unique):  # duplicates of earlier keys, half in another partition
        m = dict(rng.choice(messages))
        m["kkey"] = m["kkey"] + (b"-elsewhere" if i % 2 else b"")
        messages.append(m)
    produce(kafka_broker, topic, messages)
    handler = tmp_path / f"ledger_{tag}.py"
    handler.write_text(
        (REPO / "examples" / "ledger.py")
        .read_text()
        .replace("INSERT INTO ledger ", f"INSERT INTO ledger_{tag} ")
    )

    def booked() -> Counter[str]:
        with postgres_server.connect() as conn:
            rows = conn.execute(f"SELECT key, count(*) FROM ledger_{tag} GROUP BY key").fetchall()
        return Counter({k: n for k, n in rows})

    expected = set(keys) - poison
    kills = consumers_under_chaos(
        kafka_broker, url, topic, group, f"ledger_{tag}:record", "--transactional",
        "--batch-size", "200", "--lease", "5s", cwd=tmp_path, rng=rng, total=len(messages),
        env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"},
        # every key booked, and every message (the poison ones too) finished and committed
        done=lambda: set(booked()) == expected
        and sum(committed(kafka_broker, topic, group, PARTITIONS).values()) == len(messages),
    )  # fmt: skip
    dead = read_all(kafka_broker, f"{topic}.dlq", expect=len(poison), timeout=60)
    rows = booked()
    assert set(rows) == expected  # no key lost
    assert [k for k, n in rows.items() if n != 1] == []  # none booked twice
    dead_keys = {dict(m.headers())["idempotency-key"].decode() for m in dead}
    assert dead_keys == poison  # exactly the poison messages (redelivered copies included)
    assert kills >= 3, f"drained with only {kills} kills"


@pytest.mark.parametrize("backend", ["redis", "sqlite"])
def test_killed_consumers_with_an_outside_effect_lose_nothing(
    kafka_broker: KafkaBroker, request: pytest.FixtureRequest, backend: str, tmp_path: Path
) -> None:
    """The same chaos on Redis and SQLite with the effect outside the store (a ledger
    file): no key is lost, and a key is charged twice only when a kill fell between its
    charge and its completion: at most a batch per kill."""
    tag = uuid.uuid4().hex[:8]
    topic, group = f"chaos-{tag}", f"chaos-{tag}"
    kafka_broker.create_topic(topic, partitions=PARTITIONS)
    if backend == "redis":
        port = request.getfixturevalue("redis_server").port
        url = f"redis://127.0.0.1:{port}/0?prefix=chaos{tag}:"
    else:
        url = f"sqlite:///{tmp_path}/chaos.db"
    rng = random.Random(11)
    count = 5000
    keys = [f"pay-{i}" for i in range(int(count * 0.7))]
    messages = [{"value": {"cents": 100}, "idem": k, "kkey": k.encode()} for k in keys]
    messages += [dict(rng.choice(messages)) for _ in range(count - len(keys))]
    produce(kafka_broker, topic, messages)
    ledger = tmp_path / "ledger.txt"
    ledger.touch()
    batch = 20

    def charged() -> Counter[str]:
        return Counter(line.split()[0] for line in ledger.read_text().splitlines() if line)

    # 10 ms a charge: about 17 s of work for three consumers, so the kills land mid-run.
    handler = slow_payments(tmp_path, 0.01)
    kills = consumers_under_chaos(
        kafka_broker, url, topic, group, handler, "--batch-size", str(batch),
        "--lease", "3s", cwd=tmp_path, rng=rng, total=len(messages),
        env=ledger_env(ledger, tmp_path),
        done=lambda: set(charged()) == set(keys),
    )  # fmt: skip
    effects = charged()
    assert set(effects) == set(keys)  # none lost
    twice = [k for k, n in effects.items() if n > 1]
    print(f"{count} messages, {kills} kills, {len(twice)} keys charged twice")
    assert len(twice) <= kills * batch  # only what a kill cut off between charge and completion
    assert kills >= 3, f"drained with only {kills} kills"


@pytest.mark.parametrize("backend", QUICK_FAMILIES)
def test_ten_kills_then_the_group_drains_to_the_end(
    kafka_broker: KafkaBroker, request: pytest.FixtureRequest, backend: str, tmp_path: Path
) -> None:
    """2,000 messages, three consumers, one SIGKILLed every 2 s ten times: then, with no
    more kills, the group drains to the end (every offset committed), and no key is left
    never run. Before every hold survived a rebalance, three runs in five left a partition
    paused for good."""
    tag = uuid.uuid4().hex[:8]
    topic, group = f"drain-{tag}", f"drain-{tag}"
    kafka_broker.create_topic(topic, partitions=PARTITIONS)
    if backend == "redis":
        url = f"redis://127.0.0.1:{request.getfixturevalue('redis_server').port}/0?prefix=d{tag}:"
    elif backend == "postgres":
        url = request.getfixturevalue("postgres_server").url(schema=unique_schema())
        with open_store(url) as store:
            store.provision()
    else:
        url = f"sqlite:///{tmp_path}/drain.db"
    keys = [f"pay-{i}" for i in range(2000)]
    produce(kafka_broker, topic, [{"value": {"cents": 1}, "idem": k, "kkey": k.encode()}
                                  for k in keys])  # fmt: skip
    ledger = tmp_path / "ledger.txt"
    ledger.touch()
    # 30 ms a charge: 20 s of work for three consumers, so the ten kills land mid-run.
    handler = slow_payments(tmp_path, 0.03)

    def charged() -> set[str]:
        return {line.split()[0] for line in ledger.read_text().splitlines() if line}

    kills = consumers_under_chaos(
        kafka_broker, url, topic, group, handler, "--batch-size", "20",
        "--lease", "3s", cwd=tmp_path, rng=random.Random(13), total=len(keys), kill_limit=10,
        env=ledger_env(ledger, tmp_path),
        done=lambda: charged() == set(keys)
        and sum(committed(kafka_broker, topic, group, PARTITIONS).values()) == len(keys),
    )  # fmt: skip
    assert kills == 10
    assert set(keys) - charged() == set()  # no key never run
    assert sum(committed(kafka_broker, topic, group, PARTITIONS).values()) == len(keys)


ACCOUNT_HANDLER = """
from idemctl.consume import Event
from idemctl.runner import Context


def apply(event: Event, ctx: Context) -> None:
    body = event.json()
    ctx.connection.execute(
        "INSERT INTO accounts_TAG (id, cents, seq) VALUES (%s, %s, %s) ON CONFLICT (id) "
        "DO UPDATE SET cents = excluded.cents, seq = excluded.seq",
        (body["account"], body["cents"], ctx.sequence),
    )
    ctx.connection.execute(
        "INSERT INTO applied_TAG (account, seq) VALUES (%s, %s)", (body["account"], ctx.sequence)
    )
"""


def test_killed_transactional_consumers_keep_each_entity_and_its_sequence_together(
    kafka_broker: KafkaBroker, postgres_server: Any, tmp_path: Path
) -> None:
    """The sequence guard in transactional mode under the same chaos: every account's row
    and the guard's stored sequence agree whenever they are looked at, the applied
    sequences of an account only go up, and every account ends at its last event."""
    tag = uuid.uuid4().hex[:8]
    topic, group = f"order-{tag}", f"order-{tag}"
    kafka_broker.create_topic(topic, partitions=PARTITIONS)
    schema = unique_schema()
    url = postgres_server.url(schema=schema)
    with open_store(url) as store:
        store.provision()
    with postgres_server.connect() as conn:
        conn.execute(f"CREATE TABLE accounts_{tag} (id text PRIMARY KEY, cents bigint, seq bigint)")
        conn.execute(f"CREATE TABLE applied_{tag} (n bigserial, account text, seq bigint)")
    rng = random.Random(23)
    accounts, per_account = 100, 20
    events = [
        {"value": {"account": f"a{a}", "seq": s, "cents": s * 100}, "idem": f"a{a}-{s}",
         "kkey": f"a{a}-{s}".encode()}
        for a in range(accounts) for s in range(1, per_account + 1)
    ]  # fmt: skip
    messages = events + [dict(rng.choice(events)) for _ in range(len(events) // 3)]
    rng.shuffle(messages)  # each account's events spread over every partition, out of order
    produce(kafka_broker, topic, messages)
    (tmp_path / f"accounts_{tag}.py").write_text(ACCOUNT_HANDLER.replace("TAG", tag))
    disagreements: list[Any] = []

    def looked_at() -> bool:
        """Whether every account reached its last event; meanwhile, every row agrees with
        the guard's entity (read in one snapshot)."""
        with open_store(url) as store, postgres_server.connect() as conn:
            rows = conn.execute(f"SELECT id, seq FROM accounts_{tag}").fetchall()
            for account, seq in rows:
                entity = store.get_entity(f"account:{account}")
                if entity is None or entity.sequence is None or entity.sequence < seq:
                    disagreements.append((account, seq, entity))
        ends = committed(kafka_broker, topic, group, PARTITIONS)
        return (
            len(rows) == accounts
            and all(seq == per_account for _, seq in rows)
            and sum(ends.values()) == len(messages)
        )

    kills = consumers_under_chaos(
        kafka_broker, url, topic, group, f"accounts_{tag}:apply", "--transactional",
        "--order-key", "account:{account}", "--sequence", "seq", "--batch-size", "100",
        "--lease", "5s", cwd=tmp_path, rng=rng, total=len(messages),
        env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"}, done=looked_at,
    )  # fmt: skip
    with open_store(url) as store, postgres_server.connect() as conn:
        final = dict(conn.execute(f"SELECT id, seq FROM accounts_{tag}").fetchall())
        applied = conn.execute(f"SELECT account, seq FROM applied_{tag} ORDER BY n").fetchall()
        stored = {a: store.get_entity(f"account:{a}") for a in final}
    assert disagreements == []
    assert final == {f"a{a}": per_account for a in range(accounts)}
    assert {a: e.sequence for a, e in stored.items() if e is not None} == final
    by_account: dict[str, list[int]] = {}
    for account, seq in applied:
        by_account.setdefault(account, []).append(seq)
    for account, seqs in by_account.items():
        assert seqs == sorted(set(seqs)), (account, seqs)  # only up, and none twice
    assert kills >= 3, f"drained with only {kills} kills"
