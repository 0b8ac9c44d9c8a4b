"""verify's ``idemctl consume`` processes and the ledger their recording handler writes."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from idemctl.errors import ConfigError
from idemctl.harness.recorder import LEDGER
from idemctl.harness.scratch import Scratch
from idemctl.harness.verify.plan import HANDLER, KAFKA_DEFAULTS, POISON, Effect, Plan
from idemctl.processes import term_with_parent


class _Ledger:
    """The recording handler's ledger: a file read as it grows, (transactional mode) the
    PostgreSQL table, read on a store kept open for the run, or (fenced mode) a SQLite file
    written through the fence (idemctl.harness.recorder)."""

    def __init__(
        self, folder: Path, scratch: Scratch, transactional: bool, fenced: bool = False
    ) -> None:
        self.table = scratch.ledger_table if transactional else None
        self.path = folder / "ledger.txt"
        self.path.touch()
        self.fenced = folder / "ledger.db" if fenced else None
        if self.fenced is not None:
            _fenced_ledger(self.fenced)
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
        if self.fenced is not None:
            return f"fenced:{self.fenced}"
        return f"table:{self.table}" if self.table else f"file:{self.path}"

    def _fenced_rows(self, sql: str) -> list[tuple[Any, ...]]:
        assert self.fenced is not None
        with closing(sqlite3.connect(self.fenced, timeout=60)) as db:
            return db.execute(sql).fetchall()

    def fence_figures(self) -> tuple[int, int, dict[str, int]]:
        """--fenced: the writes that landed, those refused, and each key's standing token."""
        (writes,), (refused,) = (
            self._fenced_rows(f"SELECT count(*) FROM {t}")[0]  # noqa: S608 - our tables
            for t in ("writes", "refused")
        )
        tokens = self._fenced_rows("SELECT key, idemctl_token FROM effects")
        return int(writes), int(refused), {k: int(t) for k, t in tokens}

    def _sql(self, sql: str) -> list[tuple[Any, ...]]:
        with self._store.connection() as conn:
            return conn.execute(sql).fetchall()  # type: ignore[no-any-return]

    def effects(self) -> list[Effect]:
        """Every effect recorded, in the order written."""
        if self.fenced is not None:
            rows = self._fenced_rows("SELECT key, pid, sent, handled FROM effects ORDER BY handled")
            return [Effect(k, int(p), float(s), float(h)) for k, p, s, h in rows]
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
        if self.fenced is not None:
            return int(self._fenced_rows("SELECT count(*) FROM effects")[0][0])
        if self.table:
            return int(self._sql(f"SELECT count(*) FROM {self.table}")[0][0])  # noqa: S608
        return len(self.effects())


def _fenced_ledger(path: Path) -> None:
    """The fenced ledger: a row a key (the effect, stamped by the fence), and a row for
    each write that landed and each one refused."""
    from idemctl.fence.sql import add_fence_columns

    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("PRAGMA journal_mode=WAL")  # three consumers write it side by side
        db.execute(
            "CREATE TABLE effects (key TEXT PRIMARY KEY, pid INTEGER, sent REAL, handled REAL)"
        )
        add_fence_columns(db, "effects")
        for table in ("writes", "refused"):
            db.execute(
                f"CREATE TABLE {table} (n INTEGER PRIMARY KEY, key TEXT, pid INT, token INT)"
            )


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
                preexec_fn=term_with_parent,  # noqa: PLW1509
            )  # fmt: skip
            self.logs[proc.pid] = self._started
            self.spawned.append(proc)
        return proc

    def start_all(self) -> None:
        self.running = [self.start() for _ in range(self.plan.consumers)]

    def kill_one(self, rng: random.Random) -> None:
        index = rng.randrange(len(self.running))
        victim = self.running[index]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        # When it was dead, not when the kill was sent: an effect it wrote in between (a
        # loaded machine's milliseconds) is still one it was killed after (CI: 1 duplicate
        # judged unexplained, "0 mid-handler").
        self.killed[victim.pid] = time.time()
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
