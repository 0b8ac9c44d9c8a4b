"""Operator paths of ``idemctl consume`` that must not run a handler more often than asked,
hide work left undone, or misreport a failure; each against the real broker (tansu)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from idemctl import open_store
from idemctl.consume import ConsumeOptions, Consumer, Event, adapt
from idemctl.errors import ConfigError, ConsumeStopped, KafkaUnavailable
from idemctl.runner import Context
from tests.consume.test_consume import (
    REPO,
    committed,
    kafka_flags,
    names,
    options,
    produce,
    read_all,
)
from tests.polling import wait_until
from tests.servers import KafkaBroker


def cli(tmp_path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``idemctl ARGS`` in ``tmp_path``, without a terminal, as an operator's script runs it."""
    return subprocess.run(
        [sys.executable, "-m", "idemctl", *args],
        check=False, cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


# 1. --max-messages N runs at most N handlers --------------------------------------------


def test_max_messages_claims_and_runs_no_more_than_asked(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, [{"value": {"n": i}, "idem": f"m-{i}"} for i in range(100)])
    ran: list[str] = []
    url = f"sqlite:///{tmp_path}/keys.db"
    with open_store(url) as store:
        summary = Consumer(
            store, adapt(lambda event, ctx: ran.append(ctx.key)),
            options(kafka_broker, topic, group, max_messages=5, batch_size=100),
        ).run()  # fmt: skip
        claimed = store.stats().total
    assert ran == [f"m-{i}" for i in range(5)]
    assert summary.finished == 5 and summary.counts["executed"] == 5
    assert claimed == 5  # the rest of the fetch was never claimed
    assert committed(kafka_broker, topic, group, 1) == {0: 5}


# 2. Fail fast at start-up -----------------------------------------------------------------


def test_a_handler_that_cannot_take_an_event_stops_before_anything_is_claimed(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, [{"value": {"n": 1}, "idem": "h-1"}])
    done = cli(
        tmp_path, "--store", f"sqlite:///{tmp_path}/keys.db", "consume", "--handler", "os:getcwd",
        "--brokers", kafka_broker.bootstrap, "--topic", topic, "--group", group,
        "--exit-when-idle", "2s", *kafka_flags(kafka_broker),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "handler 'os:getcwd' takes ()" in done.stderr
    assert "(event) or (event, ctx)" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "keys.db").exists() or _total(f"sqlite:///{tmp_path}/keys.db") == 0


def _total(url: str) -> int:
    with open_store(url) as store:
        return store.stats().total


@pytest.mark.parametrize(
    ("flags", "yaml", "named"),
    [
        (["--kafka-config", "bogus.key=1"], None, "bogus.key"),
        ([], "kafka:\n  bootstrap.server: 127.0.0.1:1\n", "bootstrap.server"),
        (["--kafka-config", "session.timeout.ms=soon"], None, "session.timeout.ms"),
    ],
)
def test_a_kafka_setting_librdkafka_refuses_is_one_line_and_exit_2(
    kafka_broker: KafkaBroker, tmp_path: Path, flags: list[str], yaml: str | None, named: str
) -> None:
    topic, group = names()
    if yaml is not None:
        (tmp_path / "idemctl.yaml").write_text(yaml)
    (tmp_path / "h.py").write_text("def handle(event):\n    return None\n")
    done = cli(
        tmp_path, "--store", f"sqlite:///{tmp_path}/keys.db", "consume", "--handler", "h:handle",
        "--brokers", kafka_broker.bootstrap, "--topic", topic, "--group", group, *flags,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and named in errors[0], done.stderr
    assert "Traceback" not in done.stderr


def test_no_partitions_within_the_join_timeout_exits_7_naming_brokers_and_topics(
    tmp_path: Path,
) -> None:
    from tests.servers import free_port

    port = free_port()  # nothing listens there
    (tmp_path / "h.py").write_text("def handle(event):\n    return None\n")
    started = time.monotonic()
    done = cli(
        tmp_path, "--store", f"sqlite:///{tmp_path}/keys.db", "consume", "--handler", "h:handle",
        "--brokers", f"127.0.0.1:{port}", "--topic", "orders", "--group", "g",
        "--exit-when-idle", "1s", "--join-timeout", "3s",
    )  # fmt: skip
    assert done.returncode == 7, done.stderr
    assert time.monotonic() - started < 60
    assert f"127.0.0.1:{port}" in done.stderr and "orders" in done.stderr
    assert "Traceback" not in done.stderr


def test_brokers_lost_mid_run_show_and_end_a_drain_non_zero(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broker = KafkaBroker(tmp_path / "own")  # a broker of this test's own, to stop
    broker.start()
    try:
        topic, group = names()
        broker.create_topic(topic, partitions=1)
        produce(broker, topic, [{"value": {"n": i}, "idem": f"l-{i}"} for i in range(10)])
        states: list[str] = []
        with open_store(f"sqlite:///{tmp_path}/keys.db") as store:
            consumer = Consumer(
                store, adapt(lambda e: None),
                options(broker, topic, group, exit_when_idle=30.0, join_timeout=4.0),
                on_progress=lambda s: states.append(s.state),
            )  # fmt: skip
            failure: list[BaseException] = []

            def consume() -> None:
                try:
                    consumer.run()
                except BaseException as exc:
                    failure.append(exc)

            worker = threading.Thread(target=consume, daemon=True)
            with caplog.at_level("WARNING", logger="idemctl.consume"):
                worker.start()
                wait_until(
                    lambda: consumer.summary.counts["executed"] >= 10 or not worker.is_alive(),
                    "ten executed", detail=lambda: repr(failure),
                )  # fmt: skip
                assert consumer.summary.counts["executed"] >= 10, failure
                broker.stop()
                worker.join(60)
        assert not worker.is_alive()
        assert consumer.summary.counts["executed"] == 10
        assert len(failure) == 1 and isinstance(failure[0], KafkaUnavailable), failure
        assert broker.bootstrap in str(failure[0]) and "unreachable" in str(failure[0])
        assert "lost every broker" in caplog.text
        assert any(state.startswith("brokers unreachable") for state in states), set(states)
        assert states[0] == "joining group"
    finally:
        broker.stop()


# 3. A dead-letter storm stops the consumer ----------------------------------------------


def test_a_key_template_the_first_message_cannot_fill_stops_before_any_dead_letter(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, [{"value": {"order": i}, "idem": None} for i in range(20)])
    ran: list[str] = []
    with open_store(f"sqlite:///{tmp_path}/keys.db") as store:
        consumer = Consumer(
            store, adapt(lambda event, ctx: ran.append(ctx.key)),
            options(kafka_broker, topic, group, key="template:{missing}"),
        )  # fmt: skip
        with pytest.raises(ConfigError, match=r"--key template:\{missing\} cannot work"):
            consumer.run()
        assert store.stats().total == 0
    assert ran == [] and consumer.summary.counts["dead_lettered"] == 0
    assert read_all(kafka_broker, f"{topic}.dlq", expect=0, timeout=3) == []
    assert committed(kafka_broker, topic, group, 1) == {0: -1001}  # nothing committed


def test_the_dead_letter_breaker_stops_a_storm_without_committing_it(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    good = [{"value": {"n": i}, "idem": f"ok-{i}"} for i in range(3)]
    keyless = [{"value": {"n": i}, "idem": None} for i in range(30)]
    produce(kafka_broker, topic, good)
    produce(kafka_broker, topic, keyless)
    with open_store(f"sqlite:///{tmp_path}/keys.db") as store:
        consumer = Consumer(
            store, adapt(lambda e: None),
            options(kafka_broker, topic, group, dlq_breaker=5, batch_size=10),
        )  # fmt: skip
        with pytest.raises(ConsumeStopped, match="5 messages in a row") as stopped:
            consumer.run()
    assert "no idempotency key" in str(stopped.value)
    assert consumer.summary.counts["dead_lettered"] == 5
    assert len(read_all(kafka_broker, f"{topic}.dlq", expect=5, timeout=5)) == 5
    # The good messages' batch is committed; the batch in which the storm tripped is not.
    assert committed(kafka_broker, topic, group, 1)[0] <= 3 + 4


def test_cli_dead_letter_storm_exits_8_with_the_reason_in_one_line(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, [{"value": {"n": i}, "idem": None} for i in range(30)])
    (tmp_path / "h.py").write_text("def handle(event):\n    return None\n")
    done = cli(
        tmp_path, "--store", f"sqlite:///{tmp_path}/keys.db", "consume", "--handler", "h:handle",
        "--brokers", kafka_broker.bootstrap, "--topic", topic, "--group", group,
        "--exit-when-idle", "5s", "--dlq-breaker", "4", *kafka_flags(kafka_broker),
    )  # fmt: skip
    assert done.returncode == 8, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--dlq-breaker 4" in errors[0], done.stderr
    # 10. Without a terminal, its warnings are logfmt lines.
    warnings = [line for line in done.stderr.splitlines() if "level=warning" in line]
    assert warnings and all(line.startswith("ts=") for line in warnings), done.stderr
    assert 'msg="dead-lettered' in warnings[0]


# 4. --max-attempts bounds handler runs per key --------------------------------------------


def test_max_attempts_bounds_runs_across_duplicates_and_restarts(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=3)
    # The same key in three partitions, twice each: six deliveries of one key.
    copies = [{"value": {"n": 1}, "idem": "flaky", "kkey": f"k{i}".encode()} for i in range(6)]
    produce(kafka_broker, topic, copies)
    runs: Counter[str] = Counter()

    def flaky(event: Event, ctx: Context) -> None:
        runs[ctx.key] += 1
        raise RuntimeError("downstream refused")

    url = f"sqlite:///{tmp_path}/keys.db"
    for _ in range(2):  # a restart does not reset the count
        with open_store(url) as store:
            Consumer(
                store, adapt(flaky),
                options(kafka_broker, topic, group, max_attempts=3, backoff=0.05,
                        exit_when_idle=2.0),
            ).run()  # fmt: skip
    assert runs["flaky"] == 3
    with open_store(url) as store:
        record = store.get("flaky")
    assert record is not None and record.status.value == "failed" and not record.retriable
    dead = read_all(kafka_broker, f"{topic}.dlq", expect=6, timeout=5)
    assert len(dead) == 6  # every copy dead-lettered, none run past the bound
    assert sum(committed(kafka_broker, topic, group, 3).values()) == 6


# 6. --exit-when-idle means drained ----------------------------------------------------------


def test_exit_when_idle_does_not_count_time_without_partitions(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    from confluent_kafka import Consumer as KafkaConsumer

    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, [{"value": {"n": i}, "idem": f"d-{i}"} for i in range(20)])
    # Another member holds the only partition and reads nothing.
    holder = KafkaConsumer(
        kafka_broker.client_config(
            **{"group.id": group, "client.id": "a-holder", "enable.auto.commit": False}
        )
    )
    holder.subscribe([topic])
    deadline = time.monotonic() + 30
    while not holder.assignment():
        assert time.monotonic() < deadline
        holder.poll(0.2)
    ran: list[str] = []
    # The range assignor gives a lone partition to the member whose id sorts first, and a
    # member id starts with its client.id: the holder keeps it when the consumer joins.
    kafka = {k: str(v) for k, v in kafka_broker.client_config().items()
             if k != "bootstrap.servers"}  # fmt: skip
    with open_store(f"sqlite:///{tmp_path}/keys.db") as store:
        consumer = Consumer(
            store, adapt(lambda event, ctx: ran.append(ctx.key)),
            ConsumeOptions(kafka_broker.bootstrap, [topic], group, exit_when_idle=1.0,
                           join_timeout=0, kafka_config={**kafka, "client.id": "z-idemctl"}),
        )  # fmt: skip
        worker = threading.Thread(target=consumer.run, daemon=True)
        worker.start()
        until = time.monotonic() + 8  # well past the idle time, without a partition
        while time.monotonic() < until:
            holder.poll(0.2)
        assert worker.is_alive(), "exited 'idle' without ever holding a partition"
        holder.close()  # its partition moves to the consumer, which drains it
        worker.join(60)
    assert not worker.is_alive()
    assert sorted(ran) == sorted(f"d-{i}" for i in range(20))
    assert committed(kafka_broker, topic, group, 1) == {0: 20}


# 10. The live view -----------------------------------------------------------------------------


def test_cli_version() -> None:
    import idemctl

    done = cli(Path.cwd(), "--version", timeout=30)
    assert done.returncode == 0
    assert done.stdout.strip() == f"idemctl {idemctl.__version__}"


def test_progress_without_a_terminal_is_logfmt_with_a_recent_rate() -> None:
    from rich.console import Console

    from idemctl.cli.live import LiveStatus

    console = Console(file=_Lines(), force_terminal=False, width=250)
    status = LiveStatus(
        console, "consume", lambda s: {"state": s["state"], "lag": None},
        lambda s: s["done"], live=False, every=0, window=10,
        header={"topics": "orders", "group": "g", "store": "sqlite:///x.db"},
    )  # fmt: skip
    status.started -= 100
    status._seen[0] = (status.started, 0)
    status.update({"done": 1000, "state": "consuming"})
    line = console.file.getvalue().splitlines()[-1]  # type: ignore[attr-defined]
    fields = dict(part.split("=", 1) for part in shlex.split(line))
    assert fields["level"] == "info" and fields["ts"].endswith("Z")
    assert fields["topics"] == "orders" and fields["state"] == "consuming"
    assert "lag" not in fields  # none reported: not shown as 0
    # 1000 done over 100 s: the first rate is 10/s; then 500 more within a second is a
    # recent rate of hundreds per second, not the lifetime average.
    assert fields["rate"] == "10/s"
    at, done = status._seen[-1]
    status._seen[-1] = (at - 0.2, done)  # that update 0.2 s back, by the status's clock
    status.update({"done": 1500, "state": "consuming"})
    line = console.file.getvalue().splitlines()[-1]  # type: ignore[attr-defined]
    recent = float(dict(p.split("=", 1) for p in shlex.split(line))["rate"].removesuffix("/s"))
    assert recent > 40


class _Lines:
    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass

    def getvalue(self) -> str:
        return self.text


def _json_lines(text: str) -> list[Any]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]
