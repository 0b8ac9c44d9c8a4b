"""verify's store faults: the store's server paused (SIGSTOP) or stopped by a command."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from contextlib import suppress

from idemctl.errors import ConfigError
from idemctl.harness.scratch import Scratch
from idemctl.harness.verify.plan import Fault, Plan


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
    of a server listening on this host, or (SQLite) an exclusive lock on the file."""

    def __init__(self, plan: Plan, scratch: Scratch) -> None:
        self.plan, self.scratch = plan, scratch
        self.kind = "command" if plan.store_fault_cmd else scratch.room.fault
        if plan.store_fault_cmd and "{action}" not in plan.store_fault_cmd:
            raise ConfigError(
                "--store-fault-cmd must hold {action}, run as 'stop' then 'start', e.g. "
                "'docker {action} redis'"
            )
        self.pids: list[int] = []
        if self.kind == "pause":
            host, port = scratch.room.server()
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
