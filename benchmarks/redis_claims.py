"""Benchmark: claim + complete per message on one Redis server, idemctl against raw redis-py
(the floor) and the Redis layer of Powertools for AWS Lambda's idempotency utility.

    .venv/bin/python benchmarks/redis_claims.py [--seconds 3] [--batch 100] [--redis-url URL]
        [--reps 3] [--only floor,powertools,idemctl] [--json]

Without --redis-url it starts its own redis-server on a free 127.0.0.1 port and stops it by
PID at the end. See benchmarks/README.md for what each contender does.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from _common import (
    CENSUS_MESSAGES,
    HOST,
    BenchError,
    IdemctlBatched,
    IdemctlSingle,
    KeyLog,
    MissingPart,
    NoServer,
    Phase,
    Ratio,
    benchmark_parser,
    chosen_contenders,
    die_with_parent,
    finish,
    free_port,
    payload,
    print_ratios,
    result_for,
    run_for,
    stdout_console,
    stop_on_sigterm,
    stop_process,
    version,
)
from _common import measure as measure_with
from _common import ratios as ratios_of

REDIS_SERVER = "/usr/bin/redis-server"
LEASE_SECONDS = 30
"""The in-progress lease of every contender: idemctl's default, the floor's PX, and the
remaining time the fake Lambda context reports to Powertools."""
RETENTION_SECONDS = 600
"""How long completed keys are kept: long enough to outlive a run."""
CONTENDERS = ("floor", "powertools", "idemctl", "scripts")
TARGETS_DOC = "single >= 0.8x floor; Powertools' are retired (issue 19)"


class NoRedisServer(NoServer):
    """No redis-server binary to start, and no --redis-url given."""


# The Redis server ----------------------------------------------------------------------


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextlib.contextmanager
def own_redis_server() -> Iterator[str]:
    """A throwaway redis-server on a free loopback port; yields its URL, stops it by PID."""
    binary = REDIS_SERVER if Path(REDIS_SERVER).exists() else shutil.which("redis-server")
    if binary is None:
        raise NoRedisServer(
            f"redis-server is not installed ({REDIS_SERVER} is missing): install it with "
            "'apt-get install -y --no-install-recommends redis-server', "
            "or point the benchmark at a server with --redis-url"
        )
    with tempfile.TemporaryDirectory(prefix="idemctl-bench-") as tmp:
        log_path = Path(tmp) / "redis.log"
        for _attempt in range(3):  # the free port can be taken before the server binds it
            port = free_port()
            command = [binary, "--bind", HOST, "--port", str(port), "--dir", tmp]
            command += ["--save", "", "--appendonly", "no"]
            with log_path.open("ab") as log:
                # A session of its own: Ctrl-C reaches only us, and we stop the server in order.
                proc = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=die_with_parent(),  # noqa: PLW1509 - no threads exist yet
                )
            try:
                deadline = time.monotonic() + 10
                while proc.poll() is None and time.monotonic() < deadline:
                    if _answers_ping(port):
                        break
                    time.sleep(0.01)
                if proc.poll() is not None:
                    continue  # it exited: most likely the port was taken; try another
                if not _answers_ping(port):
                    raise BenchError(f"redis-server (pid {proc.pid}) did not answer PING in 10 s")
                yield f"redis://{HOST}:{port}/0"
                return
            finally:
                stop_process(proc, signal.SIGTERM)  # this PID only
        tail = log_path.read_text(errors="replace")[-2000:]
        raise BenchError(f"redis-server would not start; its log ends with:\n{tail}")


# Counting what a message costs ---------------------------------------------------------


BARE_WRITES = [0]
"""Writes made by the bare-socket contender (ScriptsAlone), which redis-py never sees."""


@contextlib.contextmanager
def counting_round_trips() -> Iterator[list[int]]:
    """Counts writes to Redis sockets, by redis-py (one per command, one per pipeline) and
    by the bare-socket contender.

    Every command a contender sends waits for its reply before the next, so a write is a
    round trip. Used only in the untimed census, never while measuring speed.
    """
    from redis.connection import AbstractConnection

    counter = [0]
    original = AbstractConnection.send_packed_command

    def counted(self: Any, command: Any, check_health: bool = True) -> None:
        counter[0] += 1
        original(self, command, check_health)

    AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]
    bare_before = BARE_WRITES[0]
    try:
        yield counter
    finally:
        AbstractConnection.send_packed_command = original  # type: ignore[method-assign]
        counter[0] += BARE_WRITES[0] - bare_before


def command_stats(admin: Any, field: str = "calls") -> Counter[str]:
    """Calls (or ``field``: "usec", the µs spent) per command since the server started
    (INFO commandstats), without INFO itself."""
    stats = admin.info("commandstats")
    calls: Counter[str] = Counter()
    for name, values in stats.items():
        command = name.removeprefix("cmdstat_")
        if command != "info":
            calls[command] = int(values[field])
    return calls


def script_commands() -> frozenset[str]:
    """The commands idemctl's Lua scripts run, named as INFO commandstats names them. Their
    calls and time count twice there: on their own, and in the EVALSHA that ran them."""
    from idemctl.stores.redis import load_scripts

    call = re.compile(r"""redis\.p?call\(\s*['"](\w+)['"]""")
    return frozenset(
        name.lower() for script in load_scripts().values() for name in call.findall(script.source)
    )


def connected_clients(admin: Any) -> int:
    return int(admin.info("clients")["connected_clients"])


# Contenders ------------------------------------------------------------------------------


class Floor:
    """Raw redis-py, two round trips per message and no safety: SET NX PX, then SET PX."""

    def __init__(self, url: str, prefix: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url, single_connection_client=True)
        self.prefix = f"{prefix}floor:"
        self.numbers = itertools.count()
        self.lease_ms = LEASE_SECONDS * 1000
        self.retention_ms = RETENTION_SECONDS * 1000

    def unique(self) -> int:
        i = next(self.numbers)
        key = f"{self.prefix}{i}"
        if not self.client.set(key, "in_progress", nx=True, px=self.lease_ms):
            raise BenchError(f"floor: {key} already existed")
        self.client.set(key, json.dumps(result_for(i)), px=self.retention_ms)
        return 1

    def phases(self) -> list[Phase]:
        return [Phase("floor", "floor (redis-py SET NX, SET)", "unique", self.unique)]

    def close(self) -> None:
        self.client.close()


@dataclass
class FakeLambdaContext:
    """What Powertools reads from a Lambda context: the in-progress expiry comes from
    ``get_remaining_time_in_millis``. Shaped like the fixture in Powertools' own tests."""

    function_name: str = "idemctl-bench"
    memory_limit_in_mb: int = 128
    invoked_function_arn: str = "arn:aws:lambda:eu-west-1:000000000000:function:idemctl-bench"
    aws_request_id: str = "00000000-0000-0000-0000-000000000000"

    def get_remaining_time_in_millis(self) -> int:
        return LEASE_SECONDS * 1000


class Powertools:
    """``idempotent_function`` over ``RedisCachePersistenceLayer``, as a user would write it."""

    def __init__(self, url: str, prefix: str) -> None:
        try:
            from aws_lambda_powertools.utilities.idempotency import (
                IdempotencyConfig,
                idempotent_function,
            )
            from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
                RedisCachePersistenceLayer,
            )
        except ModuleNotFoundError as exc:
            raise MissingPart(
                f"Powertools is not installed ({exc.name}): "
                ".venv/bin/pip install -e '.[bench]' (aws-lambda-powertools[redis,aws-sdk])"
            ) from exc
        import redis

        # decode_responses=True is what the layer sets when it builds its own client.
        self.client = redis.Redis.from_url(
            url, decode_responses=True, single_connection_client=True
        )
        with warnings.catch_warnings():
            # Deprecated in favour of CachePersistenceLayer, which is the same class.
            warnings.simplefilter("ignore", DeprecationWarning)
            layer = RedisCachePersistenceLayer(client=self.client)
        config = IdempotencyConfig(expires_after_seconds=RETENTION_SECONDS)
        # Outside Lambda there is no remaining time, so in-progress records would get no
        # expiry (and a warning per call): a fake context gives them a lease like the others.
        config.register_lambda_context(FakeLambdaContext())
        self.handler_calls = 0

        @idempotent_function(
            data_keyword_argument="order",
            persistence_store=layer,
            config=config,
            key_prefix=f"{prefix}powertools",
        )
        def process(order: dict[str, int]) -> dict[str, Any]:
            self.handler_calls += 1
            return result_for(order["order"])

        self.process = process
        self.numbers = itertools.count()
        self.log = KeyLog()
        self._calls_before = 0
        self._unique_before = 0

    def unique(self) -> int:
        i = next(self.numbers)
        self.process(order=payload(i))
        self.log.done.append(i)
        return 1

    def duplicate(self) -> int:
        i = self.log.next_done()
        if self.process(order=payload(i)) != result_for(i):
            raise BenchError(f"powertools: duplicate {i} did not return the stored result")
        return 1

    def _mark(self) -> None:
        self._calls_before = self.handler_calls
        self._unique_before = len(self.log.done)

    def _check_unique(self) -> None:
        ran = self.handler_calls - self._calls_before
        if ran != len(self.log.done) - self._unique_before:
            raise BenchError("powertools: the handler did not run exactly once per new key")

    def _prepare_duplicate(self) -> None:
        self.log.rewind()
        self._mark()

    def _check_duplicate(self) -> None:
        if self.handler_calls != self._calls_before:
            raise BenchError("powertools: the handler ran again for a duplicate")

    def phases(self) -> list[Phase]:
        label = "Powertools (RedisCachePersistenceLayer)"
        return [
            Phase("powertools", label, "unique", self.unique, self._mark, self._check_unique),
            Phase(
                "powertools_dup",
                label,
                "duplicate",
                self.duplicate,
                self._prepare_duplicate,
                self._check_duplicate,
            ),
        ]

    def close(self) -> None:
        self.client.close()


class ScriptsAlone:
    """idemctl's own claim and complete scripts sent over a bare socket with hiredis: no
    client library, no Record objects, constant fingerprint and result. Not a way to use
    idemctl; it shows what the scripts themselves cost, which is the ceiling for any Python
    client of them on this machine and server."""

    FINGERPRINT = "0" * 64
    RESULT = '{"charged":true}'

    def __init__(self, url: str, prefix: str, batch: int) -> None:
        import hiredis

        from idemctl.stores.redis import load_scripts
        from idemctl.stores.redis.core import index_of

        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname or HOST, parts.port or 6379))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()
        self.pack = hiredis.pack_command
        scripts = load_scripts()
        for script in scripts.values():
            self.call("SCRIPT", "LOAD", script.source)
        self.claim_sha, self.complete_sha = scripts["claim"].sha, scripts["complete"].sha
        self.prefix = f"{prefix}scripts:"
        self.lease_ms, self.retention_ms = LEASE_SECONDS * 1000, RETENTION_SECONDS * 1000
        self.owner = uuid.uuid4().hex
        self.batch = batch
        self.numbers = itertools.count()
        # The index's keys after the records', as the store sends them (lua/_lib.lua's
        # indexed() takes the last five keys as LIVE, COUNTS, DUE, GONE, FAILED).
        self.index = index_of(prefix)

    def call(self, *args: Any) -> Any:
        BARE_WRITES[0] += 1
        self.sock.sendall(self.pack(args))
        while (reply := self.reader.gets()) is False:
            data = self.sock.recv(1 << 16)
            if not data:
                raise BenchError("scripts: the server closed the connection")
            self.reader.feed(data)
        if isinstance(reply, Exception):
            raise BenchError(f"scripts: {reply}")
        return reply

    def single(self) -> int:
        key = f"{self.prefix}{{{next(self.numbers)}}}"
        ((code, token, *_),) = self.call(
            "EVALSHA", self.claim_sha, 1 + len(self.index), key, *self.index, self.lease_ms,
            self.retention_ms, self.FINGERPRINT, self.owner,
        )  # fmt: skip
        if code != b"acquired":
            raise BenchError(f"scripts: claim of new key {key} answered {code!r}")
        ((done, *_),) = self.call(
            "EVALSHA", self.complete_sha, 1 + len(self.index), key, *self.index,
            self.retention_ms, "1", self.owner, token, self.RESULT,
        )  # fmt: skip
        if done != b"done":
            raise BenchError(f"scripts: complete of {key} answered {done!r}")
        return 1

    def batched(self) -> int:
        first = next(self.numbers) * self.batch
        keys = [f"{self.prefix}b{{{i}}}" for i in range(first, first + self.batch)]
        claims = self.call(
            "EVALSHA", self.claim_sha, len(keys) + len(self.index), *keys, *self.index,
            self.lease_ms, self.retention_ms, *[self.FINGERPRINT, self.owner] * len(keys),
        )  # fmt: skip
        if len(claims) != len(keys) or any(reply[0] != b"acquired" for reply in claims):
            raise BenchError("scripts: a batch of new keys was not all acquired")
        values = [v for reply in claims for v in (self.owner, reply[1], self.RESULT)]
        done = self.call(
            "EVALSHA", self.complete_sha, len(keys) + len(self.index), *keys, *self.index,
            self.retention_ms, "0", *values,
        )  # fmt: skip
        if len(done) != len(keys) or any(reply[0] != b"ok" for reply in done):
            raise BenchError("scripts: a batch was not all completed")
        return self.batch

    def phases(self) -> list[Phase]:
        census = max(CENSUS_MESSAGES, 2 * self.batch)
        return [
            Phase("scripts_single", "idemctl's scripts alone (bare socket)", "unique",
                  self.single),
            Phase("scripts_batched", f"idemctl's scripts alone, batched x{self.batch}",
                  "unique", self.batched, census_messages=census),
        ]  # fmt: skip

    def close(self) -> None:
        self.sock.close()


def idemctl_store_url(redis_url: str, prefix: str) -> str:
    separator = "&" if "?" in redis_url else "?"
    return f"{redis_url}{separator}prefix={prefix}"


def open_idemctl_store(url: str) -> Any:
    from idemctl import IdemctlError, open_store

    try:
        return open_store(url)
    except IdemctlError as exc:
        raise MissingPart(f"idemctl cannot open its Redis store yet: {exc}") from exc


# Running ---------------------------------------------------------------------------------


def server_cpu(admin: Any) -> float:
    """CPU seconds the Redis server has used, user + system."""
    cpu = admin.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def measure(phase: Phase, seconds: float, admin: Any) -> float:
    """One timed run of ``phase``: records its rate and the CPU both sides spent on it."""
    return measure_with(phase, seconds, lambda: server_cpu(admin))


def census(phase: Phase, admin: Any) -> None:
    """Round trips and server commands per message, from an untimed pass."""
    phase.prepare()
    before = command_stats(admin)
    with counting_round_trips() as writes:
        messages = 0
        while messages < phase.census_messages:
            messages += phase.step()
    delta = command_stats(admin)
    delta.subtract(before)
    phase.check()
    phase.round_trips = writes[0] / messages
    phase.commands = {name: calls / messages for name, calls in delta.most_common() if calls}


RATIOS = (
    Ratio("idemctl single / floor (unique)", "idemctl_single", "floor", 0.8),
    Ratio("idemctl single / Powertools (unique)", "idemctl_single", "powertools"),
    Ratio("idemctl batched / Powertools (unique)", "idemctl_batched", "powertools"),
    Ratio("idemctl batched / scripts alone batched (unique)", "idemctl_batched", "scripts_batched"),
    Ratio("idemctl single / Powertools (duplicates)", "idemctl_single_dup", "powertools_dup"),
    Ratio("idemctl batched / Powertools (duplicates)", "idemctl_batched_dup", "powertools_dup"),
    Ratio("Powertools / floor (unique), for context", "powertools", "floor"),
    # What the scripts alone reach: no client could do better with them on this machine.
    Ratio("scripts alone single / Powertools (ceiling)", "scripts_single", "powertools"),
    Ratio("scripts alone single / floor (ceiling)", "scripts_single", "floor"),
    Ratio("scripts alone batched / Powertools (ceiling)", "scripts_batched", "powertools"),
)


@dataclass
class Settings:
    seconds: float
    batch: int
    reps: int
    warmup: float
    only: tuple[str, ...]
    redis_url: str | None
    as_json: bool


def benchmark(settings: Settings, redis_url: str, own_server: bool) -> dict[str, Any]:
    import redis
    from rich.console import Console

    from idemctl.urls import redact_url

    progress = Console(stderr=True)
    admin = redis.Redis.from_url(redis_url, decode_responses=True)
    prefix = f"bench-{uuid.uuid4().hex[:12]}:"
    contenders: list[Any] = []
    phases: list[Phase] = []
    try:
        for name in settings.only:
            before = connected_clients(admin)
            made: list[Any]
            if name == "floor":
                made = [Floor(redis_url, prefix)]
            elif name == "powertools":
                made = [Powertools(redis_url, prefix)]
            elif name == "scripts":
                made = [ScriptsAlone(redis_url, prefix, settings.batch)]
            else:
                store_url = idemctl_store_url(redis_url, prefix)
                made = [
                    IdemctlSingle(open_idemctl_store(store_url)),
                    IdemctlBatched(open_idemctl_store(store_url), settings.batch),
                ]
            for contender in made:
                contenders.append(contender)
                own = contender.phases()
                # Warm-up: connect, load scripts, fill caches; then count what a message costs.
                for phase in own:
                    progress.print(f"warm-up and census: {phase.name}")
                    run_for(phase, settings.warmup)
                    census(phase, admin)
                own[0].connections = connected_clients(admin) - before
                before = connected_clients(admin)
                phases.extend(own)

        # Rounds interleave the contenders, so drift on a shared machine hits them alike.
        for rep in range(1, settings.reps + 1):
            for phase in phases:
                rate = measure(phase, settings.seconds, admin)
                progress.print(f"round {rep}/{settings.reps}  {phase.name:<22} {rate:>10,.0f}/s")

        server = admin.info("server")
        return {
            "redis_url": None if own_server else redact_url(redis_url),
            "own_server": own_server,
            "redis_version": server["redis_version"],
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "versions": {
                pkg: version(pkg)
                for pkg in ("idemctl", "aws-lambda-powertools", "redis", "hiredis")
            },
            "seconds": settings.seconds,
            "reps": settings.reps,
            "batch": settings.batch,
            "results": {
                p.name: {
                    "contender": p.contender,
                    "path": p.path,
                    "ops_per_s": round(p.best, 1),
                    "reps_ops_per_s": [round(r, 1) for r in p.rates],
                    "round_trips_per_msg": p.round_trips,
                    "client_cpu_us_per_msg": round(p.client_cpu / p.messages * 1e6, 1),
                    "server_cpu_us_per_msg": round(p.server_cpu / p.messages * 1e6, 1),
                    "commands_per_msg": {k: round(v, 3) for k, v in p.commands.items()},
                    "connections": p.connections,
                }
                for p in phases
            },
            "ratios": ratios_of(RATIOS, {p.name: p for p in phases}),
        }
    finally:
        for contender in contenders:
            with contextlib.suppress(Exception):
                contender.close()
        if not own_server:  # on someone else's server, leave nothing behind
            with contextlib.suppress(Exception):
                keys = iter(admin.scan_iter(f"{prefix}*", count=1000))
                while chunk := list(itertools.islice(keys, 1000)):
                    admin.unlink(*chunk)
        admin.close()


def report(data: dict[str, Any]) -> None:
    from rich.table import Table

    console = stdout_console()
    versions = ", ".join(f"{k} {v}" for k, v in data["versions"].items() if v)
    where = "own server" if data["own_server"] else data["redis_url"]
    console.print(
        f"Redis {data['redis_version']} ({where}); Python {data['python']}; {versions}; "
        f"{data['cpus']} CPUs. Best of {data['reps']} runs of {data['seconds']:g} s each; "
        "one op = one message (claim + complete, or the claim of a duplicate)."
    )
    table = Table(
        title="Idempotent claims on Redis, one connection per contender",
        caption="server commands include those run inside Lua scripts; CPU is over all runs",
    )
    table.add_column("contender")
    table.add_column("path")
    table.add_column("ops/s (best)", justify="right")
    table.add_column("each run", justify="right")
    table.add_column("round trips/msg", justify="right")
    table.add_column("client CPU µs/msg", justify="right")
    table.add_column("server CPU µs/msg", justify="right")
    table.add_column("server commands/msg (commandstats)")
    table.add_column("conns", justify="right")
    for result in data["results"].values():
        commands = ", ".join(f"{k} {v:.2f}" for k, v in result["commands_per_msg"].items())
        table.add_row(
            result["contender"],
            result["path"],
            f"{result['ops_per_s']:,.0f}",
            " / ".join(f"{r:,.0f}" for r in result["reps_ops_per_s"]),
            f"{result['round_trips_per_msg']:.2f}",
            f"{result['client_cpu_us_per_msg']:.0f}",
            f"{result['server_cpu_us_per_msg']:.0f}",
            commands,
            "" if result["connections"] is None else str(result["connections"]),
        )
    console.print(table)
    print_ratios(console, data["ratios"], f"Ratios (targets: {TARGETS_DOC})")


def parse_args(argv: Sequence[str] | None) -> Settings:
    parser = benchmark_parser(
        "Messages per second for idempotent claim + complete on Redis: "
        "idemctl against raw redis-py and Powertools.",
        CONTENDERS,
    )
    parser.add_argument(
        "--redis-url", help="use this server instead of starting one (keys are cleaned up)"
    )
    args = parser.parse_args(argv)
    ordered = chosen_contenders(parser, args, CONTENDERS)
    return Settings(
        args.seconds, args.batch, args.reps, args.warmup, ordered, args.redis_url, args.json
    )


def check_idemctl_redis() -> None:
    """Fail before starting anything when idemctl has no Redis store to measure."""
    from idemctl import backends

    if "redis" not in backends.schemes():
        raise MissingPart(
            "idemctl has no redis:// store yet (idemctl/stores/redis.py); "
            "run with --only floor,powertools meanwhile"
        )


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_args(argv)
    stop_on_sigterm()

    def work() -> dict[str, Any]:
        if "idemctl" in settings.only:
            check_idemctl_redis()
        if settings.redis_url:
            return benchmark(settings, settings.redis_url, own_server=False)
        with own_redis_server() as url:
            return benchmark(settings, url, own_server=True)

    return finish("redis_claims", work, report, settings.as_json)


if __name__ == "__main__":
    sys.exit(main())
