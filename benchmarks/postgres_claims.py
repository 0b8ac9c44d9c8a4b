"""Benchmark: claim + complete per message on one PostgreSQL server, idemctl against raw
psycopg 3 (the floor: INSERT ... ON CONFLICT DO NOTHING, then UPDATE).

    .venv/bin/python benchmarks/postgres_claims.py [--seconds 3] [--batch 100] [--reps 3]
        [--postgres-url URL] [--fsync on|off] [--only floor,idemctl] [--json]

Without --postgres-url it initdb's a throwaway cluster, starts its own postgres on a free
127.0.0.1 port (fsync on unless --fsync off) and stops it by PID at the end. See
benchmarks/README.md for what each contender does and how statements are counted.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import os
import platform
import pwd
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import (
    HOST,
    BenchError,
    IdemctlBatched,
    IdemctlSingle,
    MissingPart,
    NoServer,
    Phase,
    Ratio,
    benchmark_parser,
    chosen_contenders,
    die_with_parent,
    finish,
    free_port,
    measure,
    print_ratios,
    ratios,
    result_for,
    run_for,
    stdout_console,
    stop_on_sigterm,
    stop_process,
    version,
)

PG_BIN = Path("/usr/lib/postgresql/15/bin")
"""Where Debian's ``postgresql`` package puts initdb and postgres (not on PATH)."""
PG_USER = "bench"
"""The superuser of the throwaway cluster (initdb -U), with trust authentication."""
CONTENDERS = ("floor", "idemctl")
TARGETS_DOC = "batched >= 10x single"
FLOOR_INSERT = "INSERT INTO t (key, status) VALUES (%s, 'in_progress') ON CONFLICT DO NOTHING"
FLOOR_UPDATE = "UPDATE t SET status='completed', result=%s WHERE key=%s"

RATIOS = (
    Ratio("idemctl single / floor (unique)", "idemctl_single", "floor"),
    Ratio("idemctl batched / idemctl single (unique)", "idemctl_batched", "idemctl_single", 10.0),
    Ratio("idemctl batched / floor (unique)", "idemctl_batched", "floor"),
    Ratio(
        "idemctl batched / idemctl single (duplicates)",
        "idemctl_batched_dup",
        "idemctl_single_dup",
    ),
)


class NoPostgresServer(NoServer):
    """No initdb/postgres binaries to start, and no --postgres-url given."""


# The PostgreSQL server -------------------------------------------------------------------


def pg_bindir() -> Path | None:
    """PostgreSQL 15's binaries, else the newest other version Debian installed."""
    if (PG_BIN / "postgres").exists():
        return PG_BIN
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/postgres"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    return versions[-1].parent if versions else None


def _as_server_user(command: list[str], pdeathsig: str | None = None) -> list[str]:
    """initdb and postgres refuse to run as root: as root, run them as ``postgres``.

    setpriv execs, so the PID we hold is the server's own; a parent-death signal set
    before it would be cleared by the change of user, so setpriv sets it afterwards."""
    if os.geteuid() != 0:
        return command
    prefix = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--reset-env"]
    if pdeathsig:
        prefix += ["--pdeathsig", pdeathsig]
    return [*prefix, "--", *command]


def _ready(url: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=1, autocommit=True) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.OperationalError:
        return False


@contextlib.contextmanager
def own_postgres_server(fsync: bool) -> Iterator[tuple[str, int]]:
    """A throwaway cluster and postgres on a free loopback port; yields its URL and the
    postmaster's PID, stops it by that PID (fast shutdown) and deletes the cluster."""
    bindir = pg_bindir()
    if bindir is None:
        raise NoPostgresServer(
            f"PostgreSQL is not installed ({PG_BIN}/postgres is missing): install it with "
            "'apt-get install -y --no-install-recommends postgresql', "
            "or point the benchmark at a server with --postgres-url"
        )
    with tempfile.TemporaryDirectory(prefix="idemctl-bench-pg-") as tmp:
        if os.geteuid() == 0:
            try:
                server_user = pwd.getpwnam("postgres")
            except KeyError:
                raise NoPostgresServer(
                    "running as root needs the 'postgres' user (the Debian package makes it) "
                    "to run initdb and postgres as"
                ) from None
            os.chown(tmp, server_user.pw_uid, server_user.pw_gid)
        data = Path(tmp) / "data"
        log_path = Path(tmp) / "postgres.log"
        initdb = [str(bindir / "initdb"), "-D", str(data), "-U", PG_USER, "--auth=trust"]
        initdb += ["-E", "UTF8", "--locale=C.UTF-8", "--no-sync"]
        with log_path.open("ab") as log:
            made = subprocess.run(
                _as_server_user(initdb),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
            )
        if made.returncode != 0:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise BenchError(f"initdb failed ({made.returncode}); its output ends with:\n{tail}")
        for _attempt in range(3):  # the free port can be taken before the server binds it
            port = free_port()
            url = f"postgresql://{PG_USER}@{HOST}:{port}/postgres"
            command = [str(bindir / "postgres"), "-D", str(data), "-p", str(port)]
            command += ["-c", f"listen_addresses={HOST}", "-c", f"unix_socket_directories={tmp}"]
            command += ["-c", f"fsync={'on' if fsync else 'off'}"]
            root = os.geteuid() == 0
            with log_path.open("ab") as log:
                # A session of its own: Ctrl-C reaches only us, and we stop the server in
                # order. If we die without stopping it, it gets SIGINT: a fast shutdown.
                proc = subprocess.Popen(
                    _as_server_user(command, pdeathsig="SIGINT"),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=None if root else die_with_parent(signal.SIGINT),  # noqa: PLW1509
                )
            try:
                deadline = time.monotonic() + 15
                while proc.poll() is None and time.monotonic() < deadline:
                    if _ready(url):
                        break
                    time.sleep(0.05)
                if proc.poll() is not None:
                    continue  # it exited: most likely the port was taken; try another
                if not _ready(url):
                    raise BenchError(f"postgres (pid {proc.pid}) did not accept a query in 15 s")
                yield url, proc.pid
                return
            finally:
                stop_process(proc, signal.SIGINT, timeout=15)  # fast shutdown, this PID only
        tail = log_path.read_text(errors="replace")[-2000:]
        raise BenchError(f"postgres would not start; its log ends with:\n{tail}")


class ServerCpu:
    """CPU seconds of a local postmaster and its children (backends, walwriter, ...),
    from /proc; children that exited count through the postmaster's cutime/cstime."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.tick = os.sysconf("SC_CLK_TCK")

    @property
    def known(self) -> bool:
        return self.pid is not None

    @staticmethod
    def _stat(pid: str) -> list[str] | None:
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None  # it exited meanwhile
        return text[text.rindex(")") + 2 :].split()  # fields from 3 (state) on

    def __call__(self) -> float:
        if self.pid is None:
            return 0.0
        ticks = 0
        root = self._stat(str(self.pid))
        if root is not None:
            ticks += sum(int(v) for v in root[11:15])  # utime stime cutime cstime
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                fields = self._stat(entry)
                if fields is not None and fields[1] == str(self.pid):  # ppid
                    ticks += int(fields[11]) + int(fields[12])
        return ticks / self.tick


# Counting what a message costs ---------------------------------------------------------

_MESSAGE = re.compile(r'^([FB])\t\d+\t(\w+)(?:\t\s*"?(\w+))?')
"""One protocol message in a libpq trace: direction, type, and the first word after it
(a CommandComplete's tag such as INSERT, a ReadyForQuery's transaction status)."""


@dataclass
class Trace:
    round_trips: int = 0
    transactions: int = 0
    statements: Counter[str] = field(default_factory=Counter)

    def add(self, text: str) -> None:
        """One connection's trace. Round trips: each switch from sending (F) to receiving
        (B). Statements: each CommandComplete by its tag, and errors. Transactions: each
        return to idle (ReadyForQuery I) after statements or a transaction block."""
        last, status, worked = "", "I", False
        for line in text.splitlines():
            match = _MESSAGE.match(line)
            if match is None:
                continue  # a continuation of a multi-line SQL text
            direction, kind, word = match.groups()
            if direction == "B" and last == "F":
                self.round_trips += 1
            last = direction
            if direction != "B":
                continue
            if kind == "CommandComplete" and word:
                self.statements[word.lower()] += 1
                worked = True
            elif kind in {"ErrorResponse", "EmptyQueryResponse"}:
                self.statements[kind] += 1
                worked = True
            elif kind == "ReadyForQuery" and word:
                if word == "I" and (worked or status != "I"):
                    self.transactions += 1
                status, worked = word, False


def open_connections(exclude: Any) -> list[Any]:
    """Every open psycopg connection of this process but ``exclude``, whoever opened it
    (the store's pool too), idle between statements."""
    import psycopg

    return [
        obj
        for obj in gc.get_objects()
        if isinstance(obj, psycopg.Connection)
        and obj is not exclude
        and not obj.closed
        and obj.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    ]


@contextlib.contextmanager
def tracing(connections: list[Any]) -> Iterator[Trace]:
    """libpq's own protocol trace (PQtrace) on ``connections``: what each sent and received.

    Untimed: used only in the census, never while measuring speed."""
    import psycopg

    result = Trace()
    files = []
    try:
        for conn in connections:
            file = tempfile.TemporaryFile()  # noqa: SIM115 - closed in the finally below
            files.append((conn, file))
            conn.pgconn.trace(file.fileno())
            conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        yield result
    finally:
        for conn, file in files:
            if not conn.closed:
                conn.pgconn.untrace()  # flushes libpq's stream; the file is ours to close
            file.seek(0)
            result.add(file.read().decode("utf-8", errors="replace"))
            file.close()


def flush_stats(connections: list[Any]) -> None:
    """Make each backend publish its pending table counts now: on its own a backend that
    published less than a second ago waits up to 10 s (PostgreSQL 15). Writes no rows."""
    for conn in connections:
        conn.execute("SELECT pg_stat_force_next_flush()", prepare=False)


def rows_written(admin: Any, schemas: list[str]) -> int:
    """Rows inserted, updated and deleted in the benchmark's own tables, as published."""
    row = admin.execute(
        "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables "
        "WHERE schemaname = ANY(%s)",
        (schemas,),
        prepare=False,
    ).fetchone()
    return int(row[0])


def client_backends(admin: Any) -> int:
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'",
        prepare=False,
    ).fetchone()
    return int(row[0])


def census(phase: Phase, admin: Any, schemas: list[str] | None) -> None:
    """Round trips, statements and transactions per message from libpq's trace, and rows
    written per message in ``schemas`` from pg_stat_user_tables, over an untimed pass."""
    phase.prepare()
    connections = open_connections(exclude=admin)
    if schemas is not None:
        flush_stats(connections)  # earlier work is published before the first reading
        before = rows_written(admin, schemas)
    with tracing(connections) as trace:
        messages = 0
        while messages < phase.census_messages:
            messages += phase.step()
    phase.check()
    phase.round_trips = trace.round_trips / messages
    phase.transactions = trace.transactions / messages
    phase.commands = {kind: n / messages for kind, n in trace.statements.most_common()}
    if schemas is not None:
        flush_stats(connections)
        phase.rows_written = (rows_written(admin, schemas) - before) / messages


# Contenders ------------------------------------------------------------------------------


class Floor:
    """Raw psycopg 3 in autocommit, two statements per message and no safety: INSERT ...
    ON CONFLICT DO NOTHING, then UPDATE. psycopg prepares both after five uses."""

    def __init__(self, url: str, schema: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True, options=f"-c search_path={schema}")
        self.conn.execute(
            "CREATE TABLE t (key text PRIMARY KEY, status text NOT NULL, result jsonb)"
        )
        self.cursor = self.conn.cursor()
        self.numbers = itertools.count()

    def unique(self) -> int:
        i = next(self.numbers)
        key = f"floor-{i}"
        cursor = self.cursor
        cursor.execute(FLOOR_INSERT, (key,))
        if cursor.rowcount != 1:
            raise BenchError(f"floor: {key} already existed")
        cursor.execute(FLOOR_UPDATE, (json.dumps(result_for(i)), key))
        if cursor.rowcount != 1:
            raise BenchError(f"floor: {key} was not updated")
        return 1

    def phases(self) -> list[Phase]:
        label = "floor (psycopg INSERT, UPDATE)"
        return [Phase("floor", label, "unique", self.unique)]

    def close(self) -> None:
        self.conn.close()


def with_options(url: str, **options: str) -> str:
    separator = "&" if "?" in url else "?"
    return url + separator + "&".join(f"{k}={v}" for k, v in options.items())


def open_idemctl_store(url: str) -> Any:
    """The store on one pooled connection, provisioned (a no-op when it already is)."""
    from idemctl import IdemctlError, open_store

    try:
        store = open_store(url)
    except IdemctlError as exc:
        raise MissingPart(f"idemctl cannot open its PostgreSQL store yet: {exc}") from exc
    try:
        store.provision()
    except IdemctlError as exc:
        store.close()
        raise BenchError(f"idemctl: provision() failed: {exc}") from exc
    return store


# Running ---------------------------------------------------------------------------------


@dataclass
class Settings:
    seconds: float
    batch: int
    reps: int
    warmup: float
    only: tuple[str, ...]
    postgres_url: str | None
    fsync: str | None
    as_json: bool


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def benchmark(
    settings: Settings, postgres_url: str, own_server: bool, server_pid: int | None
) -> dict[str, Any]:
    import psycopg
    from rich.console import Console

    from idemctl.urls import redact_url

    progress = Console(stderr=True)
    admin = psycopg.connect(postgres_url, autocommit=True)
    run_id = uuid.uuid4().hex[:12]
    floor_schema, store_schema = f"bench_{run_id}_floor", f"bench_{run_id}"
    server_cpu = ServerCpu(server_pid)
    # pg_stat_force_next_flush() came with PostgreSQL 15: no row counts before it.
    schemas = [floor_schema, store_schema] if admin.info.server_version >= 150000 else None
    # One pooled connection per store, so each contender runs on one connection.
    store_url = with_options(postgres_url, schema=store_schema, pool_max="1")
    contenders: list[Any] = []
    phases: list[Phase] = []
    try:
        for name in settings.only:
            # Made one by one: a store's pool connects as soon as it is opened, and each
            # contender's connections are counted on their own.
            makers: list[Callable[[], Any]]
            if name == "floor":
                admin.execute(f"CREATE SCHEMA {quote_ident(floor_schema)}", prepare=False)
                makers = [lambda: Floor(postgres_url, floor_schema)]
            else:
                makers = [
                    lambda: IdemctlSingle(open_idemctl_store(store_url)),
                    lambda: IdemctlBatched(open_idemctl_store(store_url), settings.batch),
                ]
            for make in makers:
                before = client_backends(admin)
                contender = make()
                contenders.append(contender)
                own = contender.phases()
                # Warm-up: connect, prepare statements, fill caches; then count what a
                # message costs.
                for phase in own:
                    progress.print(f"warm-up and census: {phase.name}")
                    run_for(phase, settings.warmup)
                    census(phase, admin, schemas)
                own[0].connections = client_backends(admin) - before
                phases.extend(own)

        # Rounds interleave the contenders, so drift on a shared machine hits them alike.
        for rep in range(1, settings.reps + 1):
            for phase in phases:
                rate = measure(phase, settings.seconds, server_cpu)
                progress.print(f"round {rep}/{settings.reps}  {phase.name:<22} {rate:>10,.0f}/s")

        def show(setting: str) -> str:
            return str(admin.execute(f"SHOW {setting}", prepare=False).fetchone()[0])

        return {
            "postgres_url": None if own_server else redact_url(postgres_url),
            "own_server": own_server,
            "server_version": show("server_version"),
            "fsync": show("fsync"),
            "synchronous_commit": show("synchronous_commit"),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "versions": {
                pkg: version(pkg)
                for pkg in ("idemctl", "psycopg", "psycopg-binary", "psycopg-c", "psycopg-pool")
            },
            "psycopg_impl": psycopg.pq.__impl__,
            "libpq": psycopg.pq.version(),
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
                    "statements_per_msg": round(sum(p.commands.values()), 3),
                    "statements_by_kind_per_msg": {k: round(v, 3) for k, v in p.commands.items()},
                    "transactions_per_msg": p.transactions,
                    "rows_written_per_msg": None
                    if p.rows_written is None
                    else round(p.rows_written, 3),
                    "client_cpu_us_per_msg": round(p.client_cpu / p.messages * 1e6, 1),
                    "server_cpu_us_per_msg": round(p.server_cpu / p.messages * 1e6, 1)
                    if server_cpu.known
                    else None,
                    "connections": p.connections,
                }
                for p in phases
            },
            "ratios": ratios(RATIOS, {p.name: p for p in phases}),
        }
    finally:
        for contender in contenders:
            with contextlib.suppress(Exception):
                contender.close()
        if not own_server:  # on someone else's server, leave nothing behind
            for schema in (floor_schema, store_schema):
                with contextlib.suppress(Exception):
                    admin.execute(f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE")
        admin.close()


def report(data: dict[str, Any]) -> None:
    from rich.table import Table

    console = stdout_console()
    versions = ", ".join(f"{k} {v}" for k, v in data["versions"].items() if v)
    where = "own server" if data["own_server"] else data["postgres_url"]
    libpq = data["libpq"]
    console.print(
        f"PostgreSQL {data['server_version']} ({where}; fsync={data['fsync']}, "
        f"synchronous_commit={data['synchronous_commit']}); Python {data['python']}; "
        f"{versions} ({data['psycopg_impl']}, libpq {libpq // 10000}.{libpq % 10000}); "
        f"{data['cpus']} CPUs. Best of {data['reps']} runs of {data['seconds']:g} s each; "
        "one op = one message (claim + complete, or the claim of a duplicate)."
    )
    table = Table(
        title="Idempotent claims on PostgreSQL, one connection per contender",
        caption="round trips, statements and transactions from libpq's trace, rows from "
        "pg_stat_user_tables; CPU is over all runs",
    )
    table.add_column("contender")
    table.add_column("path")
    table.add_column("ops/s (best)", justify="right")
    table.add_column("each run", justify="right")
    table.add_column("round trips/msg", justify="right")
    table.add_column("statements/msg (by kind)")
    table.add_column("xacts/msg", justify="right")
    table.add_column("rows written/msg", justify="right")
    table.add_column("client CPU µs/msg", justify="right")
    table.add_column("server CPU µs/msg", justify="right")
    table.add_column("conns", justify="right")

    def number(value: float | None, digits: int = 2) -> str:
        return "" if value is None else f"{value:.{digits}f}"

    for result in data["results"].values():
        kinds = ", ".join(f"{k} {v:.2f}" for k, v in result["statements_by_kind_per_msg"].items())
        statements = f"{result['statements_per_msg']:.2f}" + (f" ({kinds})" if kinds else "")
        table.add_row(
            result["contender"],
            result["path"],
            f"{result['ops_per_s']:,.0f}",
            " / ".join(f"{r:,.0f}" for r in result["reps_ops_per_s"]),
            number(result["round_trips_per_msg"]),
            statements,
            number(result["transactions_per_msg"]),
            number(result["rows_written_per_msg"]),
            number(result["client_cpu_us_per_msg"], 0),
            number(result["server_cpu_us_per_msg"], 0),
            "" if result["connections"] is None else str(result["connections"]),
        )
    console.print(table)
    print_ratios(console, data["ratios"], f"Ratios (target: {TARGETS_DOC})")


def parse_args(argv: Sequence[str] | None) -> Settings:
    parser = benchmark_parser(
        "Messages per second for idempotent claim + complete on PostgreSQL: "
        "idemctl against raw psycopg.",
        CONTENDERS,
    )
    parser.add_argument(
        "--postgres-url",
        help="use this server instead of starting one (its schemas are dropped at the end)",
    )
    parser.add_argument(
        "--fsync",
        choices=("on", "off"),
        help="fsync of the server this benchmark starts (default on)",
    )
    args = parser.parse_args(argv)
    ordered = chosen_contenders(parser, args, CONTENDERS)
    if args.fsync and args.postgres_url:
        parser.error("--fsync sets up the server this benchmark starts; not with --postgres-url")
    return Settings(
        args.seconds,
        args.batch,
        args.reps,
        args.warmup,
        ordered,
        args.postgres_url,
        args.fsync,
        args.json,
    )


def check_parts(settings: Settings) -> None:
    """Fail before starting anything when psycopg or idemctl's PostgreSQL store is missing."""
    try:
        import psycopg  # noqa: F401
    except ModuleNotFoundError as exc:
        raise MissingPart(
            f"psycopg is not installed ({exc.name}): .venv/bin/pip install -e '.[postgres]'"
        ) from exc
    if "idemctl" not in settings.only:
        return
    from idemctl import backends

    if "postgresql" not in backends.schemes():
        raise MissingPart(
            "idemctl has no postgresql:// store yet (idemctl/stores/postgres.py); "
            "run with --only floor meanwhile"
        )
    try:
        import idemctl.stores.postgres  # noqa: F401
    except Exception as exc:
        raise MissingPart(f"idemctl's PostgreSQL store does not import: {exc!r}") from exc


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_args(argv)
    stop_on_sigterm()

    def work() -> dict[str, Any]:
        check_parts(settings)
        if settings.postgres_url:
            return benchmark(settings, settings.postgres_url, own_server=False, server_pid=None)
        with own_postgres_server(fsync=settings.fsync != "off") as (url, pid):
            return benchmark(settings, url, own_server=True, server_pid=pid)

    return finish(
        "postgres_claims", work, report, settings.as_json, driver="psycopg", server="PostgreSQL"
    )


if __name__ == "__main__":
    sys.exit(main())
