"""What the long-running commands share (consume, outbox relay, verify, and audit for its
Kafka options): the brokers and librdkafka settings, the metrics server's options, the log
format of their lines, and running to the end with SIGTERM and Ctrl-C draining."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Protocol, TypeVar

import typer

from idemctl.cli.common import Settings, note, settings
from idemctl.cli.live import LiveStatus
from idemctl.errors import ConfigError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from idemctl.metrics import Ready

BrokersOption = Annotated[
    str | None,
    typer.Option(
        "--brokers",
        metavar="HOST:PORT[,...]",
        envvar="IDEMCTL_BROKERS",
        help="Kafka brokers  [default: kafka: bootstrap.servers in idemctl.yaml, "
        "else 127.0.0.1:9092]",
    ),
]
KafkaConfigOption = Annotated[
    list[str] | None,
    typer.Option("--kafka-config", metavar="KEY=VALUE", help="librdkafka setting (repeatable)"),
]


MetricsPortOption = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        metavar="PORT",
        help="Serve Prometheus metrics at :PORT/metrics (1 to 65535)",
    ),
]
MetricsHostOption = Annotated[
    str,
    typer.Option("--metrics-host", metavar="HOST", help="Address the metrics server listens on"),
]
METRICS_HOST = "0.0.0.0"  # noqa: S104 - Prometheus scrapes from elsewhere


class LogFormat(StrEnum):
    """``--log-format``: how log lines (and progress lines) look on stderr."""

    AUTO = "auto"
    JSON = "json"
    LOGFMT = "logfmt"
    TEXT = "text"


LogFormatOption = Annotated[
    LogFormat,
    typer.Option(
        "--log-format",
        envvar="IDEMCTL_LOG_FORMAT",
        case_sensitive=False,
        help="Log lines on stderr: json (an object a line), logfmt, text, or auto: text on a "
        "terminal, logfmt elsewhere",
    ),
]


def use_log_format(
    ctx: typer.Context, log_format: LogFormat, metrics_port: int | None = None
) -> Settings:
    """The command's settings, its log lines in ``log_format`` from now on; a long-running
    command's ``--metrics-port`` is checked first, before anything is opened."""
    if metrics_port is not None and not 1 <= metrics_port <= 65535:
        raise ConfigError(f"--metrics-port {metrics_port}: use a port from 1 to 65535")
    current = settings(ctx)
    current.log_format = log_format.value
    return current


def kafka_settings(
    ctx: typer.Context, brokers: str | None, flags: list[str] | None
) -> tuple[str, dict[str, str]]:
    """The brokers and librdkafka settings: idemctl.yaml's ``kafka:`` (its profile's over its
    own), then ``--kafka-config`` flags; ``--brokers`` over ``bootstrap.servers``."""
    current = settings(ctx)
    kafka = {**current.loaded_config().kafka_for(current.profile), **_pairs(flags or [])}
    configured = kafka.pop("bootstrap.servers", None)
    return brokers or configured or "127.0.0.1:9092", kafka


@contextmanager
def stop_on_signals(
    current: Settings, stop: Callable[[], None], again: Callable[[], None] | None = None
) -> Iterator[None]:
    """SIGTERM and Ctrl-C call ``stop`` (finish the work in hand, then return) inside the
    block, instead of interrupting it; a second one calls ``again`` (by default: exit 130 at
    once, committing nothing more). The previous handlers come back after the block. The
    lines that say so follow the command's ``--log-format``."""
    signalled = False

    def handle(signum: int, frame: object) -> None:
        nonlocal signalled
        name = signal.Signals(signum).name
        if signalled:
            if again is not None:
                again()
                return
            note(current, f"{name} again: exiting at once", fields={"signal": name})
            os._exit(130)
        signalled = True
        note(current, f"{name}: finishing the work in hand", fields={"signal": name})
        stop()

    previous = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


S = TypeVar("S")


class LongRun(Protocol[S]):
    """What runs until it is done or stopped, keeping a summary: consume's Consumer, the
    outbox Relay."""

    summary: S

    def run(self) -> S: ...

    def stop(self) -> None: ...


def run_to_end(
    current: Settings,
    job: LongRun[S],
    status: LiveStatus,
    metrics: Callable[[Any, CollectorRegistry], Ready],
    metrics_host: str,
    metrics_port: int | None,
) -> S:
    """Run ``job`` (a consumer or a relay) and return its summary: its progress on
    ``status``, the metrics and readiness ``metrics`` registers for it served at
    ``metrics_host:metrics_port`` when a port is given, and SIGTERM or Ctrl-C stopping it
    once the work in hand is done."""
    from idemctl.metrics import serving  # http.server and ssl: not at every start-up

    with (
        serving(lambda registry: metrics(job, registry), metrics_host, metrics_port),
        stop_on_signals(current, job.stop),
        status,
    ):
        return job.run()


def _pairs(items: list[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--kafka-config")
        pairs[name.strip()] = value
    return pairs
