"""A RabbitMQ node of the test's own (Debian's rabbitmq-server), on free loopback ports,
with its own directory and its own epmd, each stopped by its PID (SERVICES.md's recipe)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.polling import wait_until
from tests.servers import HOST, free_port

SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
CTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"


def _speaks_amqp(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1) as s:
            s.sendall(b"AMQP\x00\x00\x09\x01")
            return bool(s.recv(8))
    except OSError:
        return False


class RabbitServer:
    def __init__(self, folder: Path) -> None:
        if not os.path.exists(SERVER):
            if os.environ.get("CI"):
                pytest.fail("rabbitmq-server is missing (scripts/install-servers)")
            pytest.skip("rabbitmq-server is missing")
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.port, self.dist, self.epmd_port = free_port(), free_port(), free_port()
        (folder / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = {HOST}:{self.port}\n"
            f"distribution.listener.interface = {HOST}\n"
            "loopback_users = none\n"
        )
        (folder / "plugins").write_text("[].\n")
        self.node = f"t{self.port}@localhost"
        self.env = {
            **os.environ,
            "HOME": str(folder),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist),
            "RABBITMQ_CONFIG_FILE": str(folder / "rabbitmq"),
            "RABBITMQ_MNESIA_BASE": str(folder / "mnesia"),
            "RABBITMQ_LOG_BASE": str(folder / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(folder / "plugins"),
        }
        self.log = folder / "server.log"
        self.epmd: subprocess.Popen[bytes] | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return (
            f"amqp://guest:guest@{HOST}:{self.port}/%2F"  # the vhost "/", as kombu and pika read it
        )

    def start(self) -> RabbitServer:
        with self.log.open("ab") as log:
            # An epmd of its own (the node finds it by ERL_EPMD_PORT and starts none), so
            # that stopping it by its PID touches no other node's.
            self.epmd = subprocess.Popen(
                ["epmd", "-port", str(self.epmd_port), "-address", HOST],
                stdout=log, stderr=log, start_new_session=True,
            )  # fmt: skip
            self.proc = subprocess.Popen(
                [SERVER], env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True,
            )  # fmt: skip
        wait_until(
            lambda: _speaks_amqp(self.port), f"rabbitmq on port {self.port}", 60, interval=0.2,
            procs=[self.proc], detail=lambda: self.log.read_text(errors="replace")[-2000:],
        )  # fmt: skip
        return self

    def pending(self) -> int:
        """Messages ready or delivered and not acknowledged, in every queue (rabbitmqctl)."""
        listed = subprocess.run(
            [CTL, "-n", self.node, "list_queues", "-q", "--no-table-headers",
             "messages_ready", "messages_unacknowledged"],
            env=self.env, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        return sum(int(n) for line in listed.stdout.split("\n") for n in line.split())

    def stop(self) -> None:
        """SIGTERM to the node's process group (the script and its Erlang VM), SIGKILL past
        30 s; then its epmd."""
        for proc, grace in ((self.proc, 30), (self.epmd, 5)):
            if proc is None or proc.poll() is not None:
                continue
            os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
            with contextlib.suppress(ProcessLookupError):  # whatever of its group is left
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
