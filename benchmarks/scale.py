"""Scale-out: `idemctl consume --processes 1, 2, 4, 8` (worker processes in one consumer
group) on one topic (16 partitions, no-op handler) against one Redis server, a 3-primary
Redis Cluster and PostgreSQL: aggregate and per-process msg/s, efficiency against one
process, on one Redis the ratio to the scripts-alone ceiling, the store's CPU and the
workers' CPU.

    .venv/bin/python benchmarks/scale.py [--processes 1,2,4,8] [--messages 100000]
        [--stores redis,cluster,postgres] [--partitions 16] [--batch 500]
        [--redis-server PATH] [--json]

It starts tansu, redis-server (one, and three cluster-enabled ones for the cluster) and a
throwaway PostgreSQL cluster (fsync on) on free loopback ports, and stops each by its PID.
A store whose server is missing is left out with a note. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import HOST, BenchError, MissingPart, NoServer, finish, stdout_console, stop_on_sigterm

HERE = Path(__file__).resolve().parent
STORES = ("redis", "cluster", "postgres")
TARGET = ("cluster", 8, 5.0)
"""The issue's target: on Redis Cluster, 8 processes make >= 5x one process."""
CEILING_TARGET = 0.7
"""... and on one Redis server, enough processes make >= 0.7x the scripts alone."""
KAFKA = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "500",
         "auto.offset.reset": "earliest", "auto.commit.interval.ms": "50"}  # fmt: skip
POLL = 0.05
"""Seconds between two readings of the group's committed offsets (and of the store's CPU)."""
STABLE_FOR = 1.0
"""The group counts as stable once every process has held its partitions this long."""
COLUMNS = ("store", "processes", "messages", "aggregate msg/s", "per-process msg/s",
           "efficiency vs 1", "speed-up vs 1", "vs ceiling", "store CPU cores",
           "store CPU µs/msg", "client CPU cores", "client CPU µs/msg",
           "machine CPU cores")  # fmt: skip
OWN_SESSION: dict[str, Any] = {"stdin": subprocess.DEVNULL, "start_new_session": True}
"""Children in a session of their own: Ctrl-C reaches only us, and we stop them in order."""


def usable_cores() -> int:
    """CPUs this process may run on: its affinity, capped by a cgroup v2 quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with contextlib.suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores or 1, max(1, int(quota) // int(period)))
    return cores or 1


def store_processes(store: str, n: int) -> int:
    """The store's own busy processes with ``n`` consumers (PostgreSQL: a backend each)."""
    return {"redis": 1, "cluster": 3}.get(store, n)


def _stop(proc: subprocess.Popen[bytes], timeout: float = 10) -> None:
    """SIGTERM (unless it already exited), then SIGKILL if it lingers: by PID, reaped."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# Servers ---------------------------------------------------------------------------------


@dataclass
class Server:
    base: str
    """What each run's store URL is made from."""
    cpu: Callable[[], float]
    """CPU seconds the store's processes have used so far."""


def _redis_cpu(ports: list[int]) -> Callable[[], float]:
    import redis

    nodes = [redis.Redis(host=HOST, port=p, socket_timeout=5) for p in ports]

    def cpu() -> float:  # every thread of each server, summed over the nodes
        infos = [n.info("cpu") for n in nodes]
        return sum(float(i["used_cpu_sys"]) + float(i["used_cpu_user"]) for i in infos)

    return cpu


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _start_node(binary: str, tmp: Path) -> tuple[subprocess.Popen[bytes], int]:
    """One cluster-enabled redis-server on a port whose bus (port + 10000) is free too."""
    import redis

    for _attempt in range(5):
        port = random.randrange(15000, 22000)  # below the ephemeral range, and its bus too
        if not (_bindable(port) and _bindable(port + 10000)):
            continue
        workdir = tmp / str(port)
        workdir.mkdir()
        command = [binary, "--bind", HOST, "--port", str(port), "--dir", str(workdir)]
        command += ["--save", "", "--appendonly", "no", "--cluster-enabled", "yes"]
        command += ["--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000"]
        with (workdir / "redis.log").open("ab") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, **OWN_SESSION)
        client, deadline = redis.Redis(host=HOST, port=port), time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                if client.ping():
                    return proc, port
            time.sleep(0.02)
        _stop(proc)  # most likely the port was taken meanwhile: try another
    raise BenchError("a cluster node of redis-server would not start")


@contextlib.contextmanager
def redis_cluster(binary: str, primaries: int = 3) -> Iterator[Server]:
    """``primaries`` cluster-enabled redis-servers, all 16384 slots assigned, no replicas."""
    import redis

    with tempfile.TemporaryDirectory(prefix="idemctl-bench-cluster-") as tmp:
        procs: list[subprocess.Popen[bytes]] = []
        ports: list[int] = []
        try:
            for _ in range(primaries):
                proc, port = _start_node(binary, Path(tmp))
                procs.append(proc)
                ports.append(port)
            nodes = [redis.Redis(host=HOST, port=p, decode_responses=True) for p in ports]
            share = 16384 // primaries
            for i, node in enumerate(nodes):
                node.cluster("addslots", *range(i * share, min((i + 1) * share, 16384)))
            nodes[-1].cluster("addslots", *range(primaries * share, 16384))  # the remainder
            for port in ports[1:]:
                nodes[0].cluster("meet", HOST, port)
            want = {"cluster_state": "ok", "cluster_slots_assigned": "16384",
                    "cluster_known_nodes": str(primaries)}  # fmt: skip
            deadline = time.monotonic() + 30
            while not all(want.items() <= _info(n).items() for n in nodes):
                if time.monotonic() > deadline:
                    raise BenchError(f"Redis Cluster on ports {ports} not ok after 30 s")
                time.sleep(0.05)
            yield Server(f"redis+cluster://{HOST}:{ports[0]}", _redis_cpu(ports))
        finally:
            for proc in procs:
                _stop(proc)


def _info(node: Any) -> dict[str, str]:
    return {k: str(v) for k, v in node.cluster("info").items()}


@contextlib.contextmanager
def store_server(store: str, redis_binary: str | None) -> Iterator[Server]:
    if store in ("redis", "cluster") and redis_binary is None:
        raise NoServer("no redis-server: install it, or give --redis-server PATH")
    if store == "redis":
        import redis_claims

        redis_claims.REDIS_SERVER = str(redis_binary)  # what own_redis_server starts
        with redis_claims.own_redis_server() as url:
            yield Server(url, _redis_cpu([int(url.rsplit(":", 1)[1].split("/")[0])]))
    elif store == "cluster":
        with redis_cluster(str(redis_binary)) as server:
            yield server
    else:
        from postgres_claims import ServerCpu, own_postgres_server

        with own_postgres_server(fsync=True) as (url, pid):
            yield Server(url, ServerCpu(pid))  # the postmaster and its children, from /proc


# One run ---------------------------------------------------------------------------------


@dataclass
class Run:
    store: str
    processes: int
    messages: int
    timed: int
    """Messages committed inside the timed window (from the first commit with progress)."""
    seconds: float
    store_cpu: float
    client_cpu: float
    """CPU seconds the workers used in the timed window."""
    machine_cpu: float
    """CPU seconds every core spent busy in the timed window (the broker's too)."""
    executed: list[int] = field(default_factory=list)
    """Handlers each process ran, from its own summary."""

    @property
    def rate(self) -> float:
        return self.timed / self.seconds


@dataclass
class Consumers:
    """One ``idemctl consume --processes N`` command: its workers in one group, its one
    metrics endpoint (their figures summed), its one summary."""

    proc: subprocess.Popen[bytes] | None = None
    port: int = 0
    out: Path = Path()
    pids: list[int] = field(default_factory=list)

    def start(self, n: int, group: str, url: str, bootstrap: str, batch: int, tmp: Path) -> None:
        """``n`` workers in ``group``, on the topic of the same name."""
        from _common import free_port

        env = {k: v for k, v in os.environ.items() if not k.startswith("IDEMCTL_")}
        env["IDEMCTL_STORE"] = url  # not in argv
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
        self.port, self.out = free_port(), tmp / f"consume-{group}.json"
        # A consumer a killed benchmark leaves behind exits after 10 minutes without work.
        flags = (
            f"--brokers {bootstrap} --topic {group} --group {group} --handler _noop:handle "
            f"--batch-size {batch} --metrics-host {HOST} --metrics-port {self.port} "
            f"--exit-when-idle 600s --join-timeout 120s --processes {n} --log-format json"
        )
        command = [sys.executable, "-m", "idemctl", "--json", "consume", *flags.split()]
        for key, value in KAFKA.items():
            command += ["--kafka-config", f"{key}={value}"]
        with self.out.open("wb") as stdout, self.out.with_suffix(".err").open("wb") as stderr:
            self.proc = subprocess.Popen(
                command, stdout=stdout, stderr=stderr, cwd=tmp, env=env, **OWN_SESSION
            )

    def check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            tail = self.out.with_suffix(".err").read_text(errors="replace")[-1500:]
            raise BenchError(f"idemctl consume exited with {self.proc.returncode}:\n{tail}")

    def workers(self) -> list[int]:
        """The PIDs of the workers running now, from the supervisor's log lines."""
        started: dict[int, int] = {}
        for line in self.out.with_suffix(".err").read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if str(entry.get("msg", "")).startswith("worker ") and "pid" in entry:
                    started[int(entry["worker"])] = int(entry["pid"])
        return list(started.values())

    def ready(self) -> tuple[bool, int]:
        """Whether /readyz says every worker holds partitions, and how many they hold."""
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.port}/readyz", timeout=2) as r:
                ready = r.status == 200
            with urllib.request.urlopen(f"http://{HOST}:{self.port}/metrics", timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return False, 0
        lines = [x for x in text.splitlines() if x.startswith("idemctl_assigned_partitions")]
        return ready, int(float(lines[0].split()[-1])) if lines else 0

    def wait_stable(self, partitions: int, timeout: float = 120) -> None:
        """Until every worker holds partitions, all of them together, for STABLE_FOR s: only
        after the group's last rebalance."""
        deadline, since = time.monotonic() + timeout, None
        while True:
            self.check_alive()
            ready, held = self.ready()
            if ready and held == partitions:
                since = since or time.monotonic()
                if time.monotonic() - since >= STABLE_FOR:
                    assert self.proc is not None
                    self.pids = self.workers() or [self.proc.pid]  # --processes 1: itself
                    return
            else:
                since = None
            if time.monotonic() > deadline:
                raise BenchError(f"group not stable after {timeout:.0f} s: {held} partitions")
            time.sleep(0.1)

    def cpu(self) -> float:
        """CPU seconds the workers have used so far (from /proc; 0 elsewhere)."""
        return sum(_proc_cpu(pid) for pid in self.pids)

    def stop(self) -> dict[str, Any]:
        """SIGTERM (every worker drains and commits), SIGKILL if it lingers; its summary."""
        assert self.proc is not None
        _stop(self.proc, 30)
        try:
            return dict(json.loads(self.out.read_text()))
        except ValueError:
            tail = self.out.with_suffix(".err").read_text(errors="replace")[-1500:]
            raise BenchError(
                f"idemctl consume ended with {self.proc.returncode}:\n{tail}"
            ) from None


def machine_cpu() -> float:
    """CPU seconds every core of the machine has spent busy so far (0 without /proc/stat):
    the consumers, the store, the broker and anything else."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return 0.0
    busy = sum(int(x) for i, x in enumerate(fields[:8]) if i not in (3, 4))  # less idle, iowait
    return busy / os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int) -> float:
    """utime + stime of ``pid``, in seconds (0 when it is gone or there is no /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def produce(bootstrap: str, topic: str, n: int, partitions: int) -> list[int]:
    """``n`` messages round the partitions, each with a key of its own; each partition's
    first offset, from the delivery reports (tansu's watermarks are not to be trusted)."""
    from confluent_kafka import Producer

    first, end = [-1] * partitions, [0] * partitions
    failed: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(str(err))
            return
        p, offset = msg.partition(), msg.offset()
        first[p] = offset if first[p] < 0 else min(first[p], offset)
        end[p] = max(end[p], offset + 1)

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    run = uuid.uuid4().hex[:8]
    for i in range(n):
        value = b'{"order": %d, "amount": 100}' % i
        key: list[tuple[str, str | bytes | None]] = [("idempotency-key", f"{run}-{i}".encode())]
        producer.produce(topic, value, b"%d" % i, partition=i % partitions, headers=key,
                         on_delivery=delivered)  # fmt: skip
        if i % 1000 == 0:
            producer.poll(0)
    unsent = producer.flush(60)
    acknowledged = sum(e - max(f, 0) for f, e in zip(first, end, strict=True))
    if unsent or failed or acknowledged != n:
        raise BenchError(f"the broker acknowledged {acknowledged} of {n} messages: {failed[:1]}")
    return [max(f, 0) for f in first]


def one_run(store: str, server: Server, n: int, bootstrap: str, args: argparse.Namespace,
            tmp: Path) -> Run:  # fmt: skip
    """``n`` processes in one group: join, produce, time to all committed, stop, check."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from idemctl import open_store
    from idemctl.model import Status

    # A store, topic and group of the run's own: every key is new.
    name = f"b{uuid.uuid4().hex[:8]}"
    url = f"{server.base}?schema={name}" if store == "postgres" else f"{server.base}?prefix={name}:"
    with open_store(url) as s:
        s.provision()  # once, rather than N processes at the same moment
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, args.partitions, 1)]).values():
        future.result(15)
    del admin  # closed now, not when the broker is gone
    consumers = Consumers()
    with contextlib.ExitStack() as stack:
        consumers.start(n, name, url, bootstrap, args.batch, tmp)
        assert consumers.proc is not None
        stack.callback(_stop, consumers.proc, 30)  # on errors and Ctrl-C
        consumers.wait_stable(args.partitions)
        # Reads the group's committed offsets; never subscribes, so never joins the group.
        reader = Consumer({"bootstrap.servers": bootstrap, "group.id": name})
        stack.callback(reader.close)
        tps = [TopicPartition(name, p) for p in range(args.partitions)]
        first = produce(bootstrap, name, args.messages, args.partitions)
        # time, messages, and CPU seconds: the store's, the workers', the machine's
        start: tuple[float, int, float, float, float] | None = None
        moved, last = time.monotonic(), 0
        while True:
            committed = reader.committed(tps, timeout=10)
            now = time.perf_counter()
            done = sum(max(tp.offset - f, 0) for tp, f in zip(committed, first, strict=True))
            if done and start is None:
                start = (now, done, server.cpu(), consumers.cpu(), machine_cpu())
            if done >= args.messages:
                cpu, client, machine = server.cpu(), consumers.cpu(), machine_cpu()
                break
            if done > last:
                moved, last = time.monotonic(), done
            elif time.monotonic() - moved > 60:
                raise BenchError(f"{store}, {n} processes: stuck at {done}/{args.messages}")
            consumers.check_alive()
            time.sleep(POLL)
        summary = consumers.stop()
    assert start is not None
    if done == start[1]:
        raise BenchError("too few messages to time (raise --messages)")
    # --processes 1 is one consume process, with no supervisor: its summary is its own.
    executed = [int(w["counts"].get("executed", 0)) for w in summary.get("workers", [summary])]
    with open_store(url) as s:
        stats = s.stats()  # a SCAN of the prefix on Redis, a count of the table on PostgreSQL
    completed = stats.by_status[Status.COMPLETED]
    if sum(executed) != args.messages or completed != args.messages or stats.total != completed:
        raise BenchError(
            f"{store}, {n} processes: {args.messages} new messages, handlers ran "
            f"{sum(executed)} times ({executed}), {completed} keys completed of {stats.total}"
        )
    return Run(store, n, args.messages, done - start[1], now - start[0], cpu - start[2],
               client - start[3], machine - start[4], executed)  # fmt: skip


def scripts_alone(base: str, n: int, batch: int) -> float:
    """The ceiling on one Redis server: idemctl's claim and complete scripts over a bare
    socket, batches of ``batch`` new keys, no Kafka and no consume loop (msg/s)."""
    from redis_claims import ScriptsAlone

    with contextlib.closing(ScriptsAlone(base, f"c{uuid.uuid4().hex[:8]}:", batch)) as scripts:
        done, started = 0, time.perf_counter()
        while done < n:
            done += scripts.batched()
        return done / (time.perf_counter() - started)


# Report ----------------------------------------------------------------------------------


def verdicts(runs: list[dict[str, Any]], cores: int) -> list[dict[str, Any]]:
    """Per store: the most processes over one, the target, and whether it can be judged."""
    out = []
    for store in dict.fromkeys(r["store"] for r in runs):
        mine = {r["processes"]: r for r in runs if r["store"] == store}
        if 1 not in mine or len(mine) < 2:
            continue
        most = max(mine)
        needs = most + store_processes(store, most) + 1  # + 1: the broker
        target = TARGET[2] if (store, most) == TARGET[:2] else None
        speedup = mine[most]["speedup"]
        met = None if target is None or cores < needs else speedup >= target
        out.append({"store": store, "processes": most, "speedup": speedup, "target": target,
                    "cores_needed": needs, "judged": cores >= needs, "met": met})  # fmt: skip
    return out


def report(data: dict[str, Any]) -> None:
    from rich.table import Table

    console = stdout_console()
    table = Table(
        title=f"Scale-out of idemctl consume: {data['partitions']} partitions, batch "
        f"{data['batch']}, no-op handler; os.cpu_count() = {data['cpu_count']}, "
        f"usable cores {data['cores']}"
    )
    for column in COLUMNS:
        table.add_column(column, justify="left" if column == "store" else "right")
    for r in data["runs"]:
        up = r["speedup"] is not None
        table.add_row(r["store"], str(r["processes"]), f"{r['messages']:,}", f"{r['rate']:,.0f}",
                      f"{r['rate'] / r['processes']:,.0f}", f"{r['efficiency']:.2f}" if up else "",
                      f"{r['speedup']:.2f}x" if up else "",
                      f"{r['vs_ceiling']:.2f}x" if r["vs_ceiling"] else "",
                      f"{r['store_cpu_cores']:.2f}", f"{r['store_cpu_us_per_msg']:.1f}",
                      f"{r['client_cpu_cores']:.2f}",
                      f"{r['client_cpu_us_per_msg']:.1f}",
                      f"{r['machine_cpu_cores']:.2f}")  # fmt: skip
    console.print(table)
    for store, rate in data["ceilings"].items():
        best = max((r for r in data["runs"] if r["store"] == store), key=lambda r: r["rate"])
        ratio = best["rate"] / rate
        met = "met" if ratio >= CEILING_TARGET else "NOT met"
        console.print(f"{store}: scripts alone {rate:,.0f} msg/s; the most, {best['processes']} "
                      f"processes, {ratio:.2f}x of it (target >= {CEILING_TARGET:g}x: {met}, "
                      f"{data['cores']} usable cores)", markup=False)  # fmt: skip
    for v in data["verdicts"]:
        line = f"{v['store']}: {v['processes']} processes / 1 process: {v['speedup']:.2f}x"
        cores = f"{data['cores']} usable cores, it needs {v['cores_needed']}"
        if v["target"] is not None and v["judged"]:
            line += f" (target >= {v['target']:g}x: {'met' if v['met'] else 'NOT met'})"
        elif v["target"] is not None:
            line += f" (target >= {v['target']:g}x: cannot be judged here, {cores})"
        elif not v["judged"]:
            line += f" (no scale-out to see here: {cores})"
        console.print(line, markup=False)
    for note in data["notes"]:
        console.print(note, markup=False)


def main() -> int:
    default_redis = "/usr/bin/redis-server"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", default="1,2,4,8", help="consumer processes per run")
    parser.add_argument("--stores", default=",".join(STORES), help="a subset of these")
    parser.add_argument("--messages", type=int, default=100000, help="messages per run")
    parser.add_argument("--partitions", type=int, default=16, help="partitions of each topic")
    parser.add_argument("--batch", type=int, default=500, help="--batch-size of each process")
    parser.add_argument("--redis-server", help=f"[default: {default_redis}, else on PATH]")
    parser.add_argument("--json", action="store_true", help="the numbers as JSON after the table")
    args = parser.parse_args()
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    if unknown := sorted(set(stores) - set(STORES)):
        parser.error(f"--stores: unknown {', '.join(unknown)}; choose from {', '.join(STORES)}")
    try:
        counts = sorted({int(p) for p in args.processes.split(",") if p.strip()})
    except ValueError:
        parser.error("--processes takes whole numbers, e.g. 1,2,4,8")
    if not counts or counts[0] < 1 or min(args.messages, args.partitions, args.batch) < 1:
        parser.error("--processes, --messages, --partitions and --batch must be positive")
    redis_binary = args.redis_server or (
        default_redis if os.access(default_redis, os.X_OK) else shutil.which("redis-server")
    )
    if redis_binary and not os.access(redis_binary, os.X_OK):
        redis_binary = None
    stop_on_sigterm()

    def work() -> dict[str, Any]:
        from idemctl.harness.broker import local_broker  # tansu on a free port, by its PID

        runs: list[Run] = []
        ceilings: dict[str, float] = {}
        notes: list[str] = []
        missing = 0
        with local_broker() as bootstrap, tempfile.TemporaryDirectory() as tmp:
            for store in stores:
                with contextlib.ExitStack() as stack:  # each store's server stops after its runs
                    try:
                        server = stack.enter_context(store_server(store, redis_binary))
                    except (MissingPart, ImportError) as exc:
                        missing += isinstance(exc, NoServer)
                        why = str(exc).split(", or point the benchmark at")[0]  # no such option
                        notes.append(f"{store} left out: {why}")
                        continue
                    for n in counts:
                        runs.append(one_run(store, server, n, bootstrap, args, Path(tmp)))
                    if store == "redis":
                        ceilings[store] = scripts_alone(server.base, args.messages, args.batch)
        if not runs:  # every store left out: exit 2 when for want of a server
            raise (NoServer if missing == len(notes) else MissingPart)("; ".join(notes))
        rows = []
        for r in runs:
            one = next((x for x in runs if x.store == r.store and x.processes == 1), None)
            speedup = r.rate / one.rate if one else None
            rows.append({**vars(r), "rate": r.rate, "speedup": speedup,
                         "efficiency": speedup / r.processes if speedup else None,
                         "vs_ceiling": r.rate / ceilings[r.store] if r.store in ceilings else None,
                         "store_cpu_cores": r.store_cpu / r.seconds,
                         "store_cpu_us_per_msg": r.store_cpu / r.timed * 1e6,
                         "client_cpu_cores": r.client_cpu / r.seconds,
                         "client_cpu_us_per_msg": r.client_cpu / r.timed * 1e6,
                         "machine_cpu_cores": r.machine_cpu / r.seconds})  # fmt: skip
        cores = usable_cores()
        return {"cpu_count": os.cpu_count(), "cores": cores, "partitions": args.partitions,
                "batch": args.batch, "messages": args.messages, "runs": rows,
                "ceilings": ceilings,
                "verdicts": verdicts(rows, cores), "notes": notes}  # fmt: skip

    return finish("scale", work, report, args.json)


if __name__ == "__main__":
    sys.exit(main())
