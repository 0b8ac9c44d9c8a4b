"""Consume throughput: `idemctl consume`'s loop with a no-op handler on each store, one
message at a time and batched, against a bare confluent-kafka at-least-once loop (poll, read
the key header, store_offsets) on the same broker, the same messages, in the same run; and
batched with the sequence guard on (--order-key/--sequence), every message its own entity;
and, as ceilings, idemctl's store alone (and on Redis its scripts alone) with no Kafka, the
server's own time per message, and on Redis the server time per key of each store call.

    .venv/bin/python benchmarks/consume_throughput.py [--messages 20000] [--batch 500]
        [--single-messages 2000] [--rounds 3] [--stores redis,sqlite,postgres,dynamodb]
        [--targets-only] [--json]

Consume batched and the ceilings it is held to run ``--rounds`` times, one after the other
(consume, its ceilings, consume, ...), each time on new keys: the machine's speed drifts by
half within minutes on a shared host, so each target's figure is the median of the rounds'
ratios, each ratio of two rates measured a minute apart at most, and the rates shown are
the rounds' medians.

It starts tansu, redis-server, a throwaway PostgreSQL cluster and a moto server on free
loopback ports, as the stores chosen need them, and stops each by its PID. A store whose
server or package is missing is left out with a note. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import HOST, BenchError, free_port, stdout_console, stop_on_sigterm, stop_process

STORES = ("redis", "sqlite", "postgres", "dynamodb")
NAMES = {"redis": "Redis", "sqlite": "SQLite", "postgres": "PostgreSQL", "dynamodb": "DynamoDB"}
CEILINGS = {"redis": ("scripts alone", "store alone"), "sqlite": ("store alone",),
            "postgres": ("store alone",)}  # fmt: skip
TARGETS = (("redis", "scripts alone", 0.6), ("redis", "store alone", None),
           ("sqlite", "store alone", 0.7), ("postgres", "store alone", 0.7))  # fmt: skip
"""Consume batched over a ceiling of the same store in the same run, and its target."""
FINGERPRINT = "e28f09810bc0e2768ccdcba95602b66b56c6ad437ed1d7d345a7f6252f38ba23"
"""One fingerprint for every key of the ceilings (idemctl's of {"order": 0}): none computed."""
WINDOW = (
    "server µs/msg: Redis: INFO commandstats µs of the commands clients sent (the GET, SET, "
    "TIME a script runs count inside its EVALSHA), PostgreSQL: CPU of the postmaster and its "
    "children (/proc); read at both ends of the window msg/s is counted over (consume runs: "
    "from the first progress report with work done to the first with all of it; ceilings: "
    "the timed loop, after one warm-up batch)."
)
Meter = Callable[[], float]
"""The server's own time so far, in µs."""
GUARD = {"order_key": "acct:{order}", "sequence": "seq"}
CONSUMER = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "500",
            "auto.offset.reset": "earliest"}  # fmt: skip
FAKE_AWS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}  # fmt: skip


def start(cmd: list[str], ready: Callable[[], bool], name: str, **popen: Any) -> Any:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **popen)
    deadline = time.monotonic() + 30
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_process(proc)
            raise BenchError(f"{name} did not start")
        time.sleep(0.05)
    return proc


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    port = free_port()

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}/moto-api/", timeout=0.5):
                return True
        except OSError:
            return False

    cmd = [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)]
    proc = start(cmd, ready, "moto server", env={**os.environ, **FAKE_AWS})
    try:
        yield f"http://{HOST}:{port}"
    finally:
        stop_process(proc)


def produce(bootstrap: str, topic: str, n: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until its futures resolve
    for f in admin.create_topics([NewTopic(topic, 3, 1)]).values():
        f.result(15)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        value = b'{"order": %d, "seq": %d}' % (i, i + 1)
        p.produce(topic, value=value, headers=[("idempotency-key", b"k-%d" % i)])
        if i % 10000 == 0:
            p.poll(0)
    p.flush(60)


def bare(bootstrap: str, topic: str, n: int, batch: int) -> float:
    """Messages per second of the plain at-least-once loop, after its first batch."""
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bare-{uuid.uuid4().hex}",
                  "enable.auto.offset.store": False, **CONSUMER})  # fmt: skip
    c.subscribe([topic])
    seen, first, t0 = 0, 0, 0.0
    while seen < n:
        msgs = c.consume(num_messages=batch, timeout=1.0)
        for m in msgs:
            if m.error() is None:
                dict(m.headers() or ()).get("idempotency-key")
                c.store_offsets(message=m)
                seen += 1
        if msgs and not t0:
            first, t0 = seen, time.perf_counter()
    elapsed = time.perf_counter() - t0
    c.close()
    return (seen - first) / elapsed


@contextlib.contextmanager
def provisioned(url: str) -> Iterator[Any]:
    from idemctl import open_store

    with open_store(url) as store:
        store.provision()
        yield store


def idemctl_loop(
    bootstrap: str, topic: str, n: int, batch: int, url: str, meter: Meter | None, **more: Any
) -> tuple[float, float | None]:
    """Messages per second of the consume loop with a no-op handler, after its first batch,
    and the server's µs per message over the same window; every message must come out
    processed once. ``more``: further ConsumeOptions."""
    from idemctl.consume import ConsumeOptions, Consumer, adapt

    ends: list[tuple[int, float, float]] = []  # (finished, time, server µs) at both ends
    read = meter or (lambda: 0.0)
    options = ConsumeOptions(bootstrap, [topic], f"idem-{uuid.uuid4().hex}", batch_size=batch,
                             max_messages=n, kafka_config=CONSUMER, **more)  # fmt: skip

    # From the first progress report with work done (after the group join and the first
    # batch) to the first with all of it (before the consumer closed); the server is read
    # outside the timed span.
    def mark(summary: Any) -> None:
        if not ends and summary.finished > 0:
            server = read()
            ends.append((summary.finished, time.perf_counter(), server))
        elif len(ends) == 1 and summary.finished >= n:
            now = time.perf_counter()
            ends.append((summary.finished, now, read()))

    with provisioned(url) as store:
        summary = Consumer(store, adapt(lambda event: None), options, on_progress=mark).run()
    if summary.counts["executed"] != n:  # every key is new: each handler runs once
        raise BenchError(f"{url.partition('?')[0]}: {summary.counts} for {n} new messages")
    if len(ends) < 2 or ends[1][0] == ends[0][0]:
        raise BenchError(f"{url.partition('?')[0]}: too few messages to time (raise --messages)")
    ((first, t0, s0), (last, t1, s1)) = ends
    return (last - first) / (t1 - t0), (s1 - s0) / (last - first) if meter else None


def claim(store: Any, keys: list[str], want: type, single: bool = False) -> list[Any]:
    """Claims of ``keys`` (claim_many, or one claim each), each of which must come out ``want``."""
    from idemctl import ClaimRequest

    if single:
        outcomes = [store.claim(key, FINGERPRINT) for key in keys]
    else:
        outcomes = store.claim_many([ClaimRequest(key, FINGERPRINT) for key in keys])
    if len(outcomes) != len(keys) or not all(isinstance(o, want) for o in outcomes):
        raise BenchError(f"a claim of {len(keys)} keys did not give {want.__name__} for each")
    return outcomes


def complete(store: Any, acquired: list[Any], single: bool = False) -> None:
    """Completions of what ``claim`` acquired, with no result (complete_many, or one each)."""
    from idemctl import Completion

    if single:
        for a in acquired:
            store.complete(a.key, a.owner, a.fencing_token, None)
    elif not all(store.complete_many([Completion(a.key, a.owner, a.fencing_token, None)
                                      for a in acquired])):  # fmt: skip
        raise BenchError(f"complete_many of {len(acquired)} claimed keys did not complete them")


def timed(step: Callable[[], int], n: int, meter: Meter | None) -> tuple[float, float | None]:
    """Messages per second of ``step`` (handles some messages, says how many) until ``n``
    messages, after one untimed warm-up step; and the server's µs per message meanwhile."""
    read = meter or (lambda: 0.0)
    step()
    server, done, t0 = read(), 0, time.perf_counter()
    while done < n:
        done += step()
    rate = done / (time.perf_counter() - t0)
    return rate, (read() - server) / done if meter else None


def ceiling(run: str, server: Server, url: str, n: int, batch: int) -> tuple[float, float | None]:
    """Batches of new keys claimed and completed with no Kafka, no handler and one constant
    fingerprint: by idemctl's store ("store alone"), or on Redis by its claim and complete
    scripts over a bare socket ("scripts alone", redis_claims.ScriptsAlone: no client
    library). No consume loop on that store and server can beat the scripts alone."""
    from idemctl import Acquired

    if run == "scripts alone":
        from redis_claims import ScriptsAlone

        prefix = f"b{uuid.uuid4().hex[:8]}:"
        with contextlib.closing(ScriptsAlone(server.base, prefix, batch)) as scripts:
            return timed(scripts.batched, n, server.meter)
    numbers = itertools.count()
    with provisioned(url) as store:

        def new_batch() -> int:
            first = next(numbers) * batch
            complete(store, claim(store, [f"k-{i}" for i in range(first, first + batch)], Acquired))
            return batch

        return timed(new_batch, n, server.meter)


def sent(stats: Counter[str], inner: frozenset[str]) -> float:
    """INFO commandstats' count of the commands clients sent: not those run inside scripts,
    whose calls and time are also inside the EVALSHA that ran them."""
    return float(sum(v for k, v in stats.items() if k not in inner))


def redis_key_costs(server: Server, n: int, batch: int) -> list[dict[str, Any]]:
    """The Redis server's time per key of idemctl's store calls, from INFO commandstats
    deltas around ``n`` keys each: claims of new keys, their completions and claims of them
    again (duplicates), batched and one call per key."""
    from redis_claims import command_stats, script_commands

    from idemctl import Acquired, Completed

    inner, costs = script_commands(), []

    @contextlib.contextmanager
    def cost(operation: str) -> Iterator[None]:
        usec, calls = command_stats(server.admin, "usec"), command_stats(server.admin)
        yield
        usec = command_stats(server.admin, "usec") - usec
        calls = command_stats(server.admin) - calls
        costs.append({
            "operation": operation,
            "keys": n,
            "keys_per_call": n / sent(calls, inner),
            "server_us_per_key": sent(usec, inner) / n,
            "in_script_commands_us_per_key": sum(usec[k] for k in inner) / n,
            "script_commands_per_key": {k: calls[k] / n for k in sorted(inner) if calls[k]},
        })  # fmt: skip

    with provisioned(_store_url("redis", server.base, "")) as store:
        for single in (False, True):  # warm-up: connections opened, scripts loaded
            complete(store, claim(store, [f"warm-up-{single}"], Acquired, single), single)
        for single, how in ((False, f"batched x{batch}"), (True, "one at a time")):
            keys = [f"{how[0]}-{i}" for i in range(n)]
            chunks = [keys] if single else [keys[i : i + batch] for i in range(0, n, batch)]
            with cost(f"claim, new keys, {how}"):
                done = [claim(store, chunk, Acquired, single) for chunk in chunks]
            with cost(f"complete, new keys, {how}"):
                for acquired in done:
                    complete(store, acquired, single)
            with cost(f"claim, duplicates, {how}"):
                for chunk in chunks:
                    claim(store, chunk, Completed, single)
    return costs


@dataclass
class Server:
    """What a store's URLs are made from (a server's address; nothing for SQLite), and where
    it can be read, the server's own time (``meter``) and a client of it (Redis: for INFO)."""

    base: str
    meter: Meter | None = None
    admin: Any = None


@dataclass
class Row:
    store: str | None
    run: str
    contender: str
    messages: int
    batch: int
    rate: float
    server_us_per_msg: float | None = None
    rates: list[float] | None = None
    """Each round's rate, where the run was repeated (``rate`` is their median)."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20000, help="messages on the topic")
    parser.add_argument("--batch", type=int, default=500, help="messages per poll batch")
    parser.add_argument("--single-messages", type=int, default=2000,
                        help="messages each one-at-a-time run consumes")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3,
                        help="times consume batched and its ceilings run, alternated")  # fmt: skip
    parser.add_argument("--stores", default=",".join(STORES), help="a subset of these")
    parser.add_argument("--targets-only", action="store_true",
                        help="only the runs the targets are measured on")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="the rates as JSON after the table")
    args = parser.parse_args()
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    if unknown := sorted(set(stores) - set(STORES)):
        parser.error(f"--stores: unknown {', '.join(unknown)}; choose from {', '.join(STORES)}")
    stop_on_sigterm()
    from idemctl.harness.broker import local_broker  # tansu on a free port, stopped by its PID

    rows: list[Row] = []
    key_costs: list[dict[str, Any]] = []
    notes: list[str] = []
    with contextlib.ExitStack() as servers, tempfile.TemporaryDirectory() as tmp:
        bootstrap = servers.enter_context(local_broker())
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        produce(bootstrap, topic, args.messages)
        rows.append(Row(None, "bare loop", "bare confluent-kafka loop", args.messages,
                        args.batch, bare(bootstrap, topic, args.messages, args.batch)))  # fmt: skip
        for store in stores:
            try:
                server = servers.enter_context(_server_for(store))
            except (BenchError, ImportError, OSError) as exc:
                notes.append(f"{store} left out: {exc}")
                continue
            single = min(args.single_messages, args.messages)
            rows += _rounds(store, server, bootstrap, topic, tmp, args.messages, args.batch,
                            args.rounds)  # fmt: skip
            if args.targets_only:
                continue
            runs: tuple[tuple[str, int, int, dict[str, Any]], ...] = (
                # As before the completer: one complete_many after all the batch's handlers.
                ("batched, completed at the batch's end", args.messages, args.batch,
                 {"complete_batch": args.batch, "complete_wait": 3600.0}),
                # Every message its own entity: the guard's own cost (ask, then advance).
                ("batched, sequence guard", args.messages, args.batch, GUARD),
                ("single", single, 1, {}),
            )  # fmt: skip
            for label, n, batch, more in runs:
                url = _store_url(store, server.base, tmp)
                rate, us = idemctl_loop(bootstrap, topic, n, batch, url, server.meter, **more)
                rows.append(Row(store, label, f"idemctl, {store}, {label}", n, batch, rate, us))
            if store == "redis":
                key_costs = redis_key_costs(server, args.messages, args.batch)
    _print(rows, key_costs, notes, args.json)
    return 0


def _rounds(
    store: str, server: Server, bootstrap: str, topic: str, tmp: str, n: int, batch: int,
    rounds: int,
) -> list[Row]:  # fmt: skip
    """Consume batched and the ceilings of ``store``, alternated ``rounds`` times, each on a
    store of its own: one row each, its rate the rounds' median."""
    runs = ("batched", *CEILINGS.get(store, ()))
    measured: dict[str, list[tuple[float, float | None]]] = {run: [] for run in runs}
    for _ in range(max(rounds, 1)):
        for run in runs:
            url = _store_url(store, server.base, tmp)
            if run == "batched":
                measured[run].append(idemctl_loop(bootstrap, topic, n, batch, url, server.meter))
            else:
                measured[run].append(ceiling(run, server, url, n, batch))
    rows = []
    for run, found in measured.items():
        rates = [rate for rate, _ in found]
        us = [u for _, u in found if u is not None]
        contender = (
            f"idemctl, {store}, batched"
            if run == "batched"
            else f"ceiling: {NAMES[store]} {run}, no Kafka"
        )
        rows.append(Row(store, run, contender, n, batch, statistics.median(rates),
                        statistics.median(us) if us else None, rates))  # fmt: skip
    return rows


@contextlib.contextmanager
def _server_for(store: str) -> Iterator[Server]:
    """A store's server, started here, with what can be read of its own time."""
    if store == "redis":
        import redis
        from redis_claims import command_stats, own_redis_server, script_commands

        inner = script_commands()
        with own_redis_server() as url, redis.Redis.from_url(url, decode_responses=True) as admin:
            yield Server(url, lambda: sent(command_stats(admin, "usec"), inner), admin)
    elif store == "postgres":
        from postgres_claims import ServerCpu, own_postgres_server

        with own_postgres_server(fsync=True) as (url, pid):
            cpu = ServerCpu(pid)
            yield Server(url, lambda: cpu() * 1e6)
    elif store == "dynamodb":
        import moto  # noqa: F401 - the server below is moto's

        os.environ.update(FAKE_AWS)  # boto3 signs every request, and moto accepts any key
        with moto_server() as endpoint:
            yield Server(endpoint)
    else:
        yield Server("")


def _store_url(store: str, base: str, tmp: str) -> str:
    """A store of its own for every run, so each run's keys are all new."""
    name = f"b{uuid.uuid4().hex[:8]}"
    if store == "redis":
        return f"{base}?prefix={name}:"
    if store == "postgres":
        return f"{base}?schema={name}"
    if store == "dynamodb":
        return f"dynamodb://{name}?region=us-east-1&endpoint_url={base}"
    return f"sqlite:///{tmp}/{name}.db"


def _targets(rows: list[Row]) -> list[dict[str, Any]]:
    """Consume batched over each ceiling of its store that ran, with its target if any: the
    median of the rounds' ratios (each round's consume over the same round's ceiling)."""
    rates = {(row.store, row.run): row.rates or [row.rate] for row in rows}
    found = []
    for store, run, target in TARGETS:
        now, top = rates.get((store, "batched")), rates.get((store, run))
        if now and top:
            each = [a / b for a, b in zip(now, top, strict=True)]
            value = statistics.median(each)
            met = None if target is None else value >= target
            found.append({"store": store, "ratio": f"consume batched / {run}", "value": value,
                          "rounds": each, "target": target, "met": met})  # fmt: skip
    return found


def _print(
    rows: list[Row], key_costs: list[dict[str, Any]], notes: list[str], as_json: bool
) -> None:
    from rich.table import Table

    def number(value: float | None, digits: int = 1) -> str:
        return "" if value is None else f"{value:,.{digits}f}"

    base = rows[0].rate
    table = Table(title="Consume throughput, no-op handler, 3 partitions")
    for column in ("contender", "messages", "batch", "msg/s", "x bare loop", "server µs/msg"):
        table.add_column(column, justify="left" if column == "contender" else "right")
    for row in rows:
        table.add_row(row.contender, f"{row.messages:,}", str(row.batch), f"{row.rate:,.0f}",
                      f"{row.rate / base:.3f}", number(row.server_us_per_msg))  # fmt: skip
    console = stdout_console()
    console.print(table)
    console.print(WINDOW, markup=False)
    rates = {(row.store, row.run): row.rate for row in rows}
    for store in STORES:
        now = rates.get((store, "batched"))
        before = rates.get((store, "batched, completed at the batch's end"))
        if now and before:
            console.print(
                f"{store}: each key completed as its handler returns / at the batch's end: "
                f"{now / before:.2f}x",
                markup=False,
            )
        guarded = rates.get((store, "batched, sequence guard"))
        if now and guarded:
            console.print(
                f"{store}: cost per message with the sequence guard / without: "
                f"{now / guarded:.2f}x",
                markup=False,
            )
    targets = _targets(rows)
    for t in targets:
        verdict = "met" if t["met"] else "NOT met"
        goal = "" if t["target"] is None else f" (target >= {t['target']:g}x: {verdict})"
        each = ", ".join(f"{r:.2f}" for r in t["rounds"])
        console.print(
            f"{t['store']}: {t['ratio']}: {t['value']:.2f}x{goal}, the median of the rounds' "
            f"{each}",
            markup=False,
        )
    if key_costs:
        costs = Table(title="Redis server time per key (INFO commandstats)")
        for column in ("operation", "keys", "keys/call", "server µs/key",
                       "of it in GET, SET... µs/key", "commands in the scripts/key"):  # fmt: skip
            costs.add_column(
                column, justify="left" if column.startswith(("op", "com")) else "right"
            )
        for c in key_costs:
            commands = ", ".join(f"{k} {v:.3g}" for k, v in c["script_commands_per_key"].items())
            costs.add_row(c["operation"], f"{c['keys']:,}", number(c["keys_per_call"]),
                          number(c["server_us_per_key"], 2),
                          number(c["in_script_commands_us_per_key"], 2), commands)  # fmt: skip
        console.print(costs)
        console.print(
            "server µs/key: INFO commandstats µs of the EVALSHA calls (the commands a script "
            "runs are inside its time, and also shown on their own), over the keys.",
            markup=False,
        )
    for note in notes:
        console.print(note, markup=False)
    if as_json:
        data = {
            "rows": [{**vars(r), "ratio": r.rate / base} for r in rows],
            "server_time": WINDOW,
            "targets": targets,
            "redis_server_time_per_key": key_costs,
            "notes": notes,
        }
        print(json.dumps(data, indent=2))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
