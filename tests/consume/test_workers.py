"""``consume --processes``'s pure parts: the workers' command line from the options given,
and their metrics summed into one exposition."""

from __future__ import annotations

from typing import Any

import pytest
import typer

from idemctl.cli import app
from idemctl.cli.workers import processes_wanted, worker_args
from idemctl.errors import ConfigError


def consume_context(*args: str) -> Any:
    command: Any = typer.main.get_command(app)
    root = command.make_context("idemctl", ["consume", *args])
    name, sub, rest = command.resolve_command(root, ["consume", *args])
    return sub.make_context(name, rest, parent=root)


def test_a_worker_gets_the_options_given_but_the_supervisor_s_own() -> None:
    ctx = consume_context(
        "--topic", "a", "--topic", "b", "--group", "g", "--handler", "m:f",
        "--batch-size", "500", "--transactional", "--processes", "4",
        "--metrics-port", "9100", "--log-format", "text", "--brokers", "k:9092",
        "--kafka-config", "sasl.password=secret", "--store", "redis://:pw@h/0",
    )  # fmt: skip
    args = worker_args(ctx)
    assert args == [
        "--handler", "m:f", "--topic", "a", "--topic", "b", "--group", "g",
        "--batch-size", "500", "--transactional",
    ]  # fmt: skip
    assert "secret" not in " ".join(args) and "pw" not in " ".join(args)


def test_processes_takes_a_count_or_auto() -> None:
    import os

    assert processes_wanted("3") == 3
    assert processes_wanted("auto") == len(os.sched_getaffinity(0))
    for bad in ("0", "-1", "1025", "two"):
        with pytest.raises(ConfigError, match="use a whole number from 1 to 1024, or auto"):
            processes_wanted(bad)


def test_workers_metrics_are_summed_into_one_exposition() -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from idemctl.metrics import Scraped, merged

    def worker(executed: float, partitions: float, bucket: float) -> str:
        return (
            "# TYPE idemctl_messages counter\n"
            f'idemctl_messages_total{{outcome="executed"}} {executed}\n'
            f'idemctl_messages_created{{outcome="executed"}} 1.7e9\n'
            "# TYPE idemctl_assigned_partitions gauge\n"
            f"idemctl_assigned_partitions {partitions}\n"
            "# TYPE idemctl_handler_duration_seconds histogram\n"
            f'idemctl_handler_duration_seconds_bucket{{le="0.01"}} {bucket}\n'
            f'idemctl_handler_duration_seconds_bucket{{le="+Inf"}} {bucket}\n'
            f"idemctl_handler_duration_seconds_count {bucket}\n"
            f"idemctl_handler_duration_seconds_sum {bucket / 100}\n"
            "# TYPE idemctl_build_info gauge\n"
            'idemctl_build_info{version="0.1.0"} 1\n'
        )

    registry = CollectorRegistry()
    registry.register(Scraped(lambda: merged([worker(10, 2, 4), worker(5, 2, 6)])))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }
    assert samples[("idemctl_messages_total", (("outcome", "executed"),))] == 15
    assert samples[("idemctl_assigned_partitions", ())] == 4
    assert samples[("idemctl_handler_duration_seconds_bucket", (("le", "+Inf"),))] == 10
    assert samples[("idemctl_handler_duration_seconds_count", ())] == 10
    assert samples[("idemctl_build_info", (("version", "0.1.0"),))] == 1
    assert not [name for name, _ in samples if name.endswith("_created")]
