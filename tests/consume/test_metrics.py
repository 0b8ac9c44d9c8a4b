"""``idemctl consume --metrics-port``: prometheus_client's exposition, read back with its own
parser, from a consumer on the real broker and a real Redis; ``/healthz`` and ``/readyz``,
which turns unready while the store is down and ready again when it is back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests import polling
from tests.consume.test_consume import REPO, kafka_flags, names, produce
from tests.scrape import Samples, dashboard_metrics, probe, scrape
from tests.servers import KafkaBroker, RedisServer, free_port


def wait_until(what: str, ok: Callable[[], bool], timeout: float = 60) -> None:
    """``ok`` within ``timeout`` (tests/polling.py's, the arguments in this file's order)."""
    polling.wait_until(ok, what, timeout, 0.1)


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_metrics_are_prometheus_and_readyz_follows_the_store(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=2)
    good = [{"value": {"n": i}, "idem": f"m-{i}", "kkey": str(i).encode()} for i in range(40)]
    produce(kafka_broker, topic, [*good, *good[:10], {"value": {"n": -1}, "idem": None}])
    (tmp_path / "noop.py").write_text("def handle(event):\n    return event.offset\n")
    server = RedisServer(tmp_path).start()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "idemctl", "consume", "--brokers", kafka_broker.bootstrap,
         "--topic", topic, "--group", group, "--handler", "noop:handle", "--json",
         "--batch-size", "20", "--backoff", "200ms", *kafka_flags(kafka_broker),
         "--metrics-port", str(port), "--metrics-host", "127.0.0.1"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
             "IDEMCTL_STORE": f"redis://127.0.0.1:{server.port}/0?socket_timeout=1s"},
    )  # fmt: skip
    try:
        wait_until("the metrics port", lambda: _answers(port))
        wait_until(
            "every message handled",
            lambda: (
                value(scrape(port)[0], "idemctl_messages_total", outcome="executed") == 40
                and value(scrape(port)[0], "idemctl_messages_total", outcome="dead_lettered") == 1
            ),
        )
        samples, types = scrape(port)
        assert value(samples, "idemctl_messages_total", outcome="replayed") == 10
        assert value(samples, "idemctl_dead_letters_total", reason="no idempotency key") == 1
        assert value(samples, "idemctl_stale_events_total") == 0
        # Every handler run timed, every claim and completion round trip timed by store.
        assert value(samples, "idemctl_handler_duration_seconds_count") == 40
        assert types["idemctl_handler_duration_seconds"] == "histogram"
        claims = value(
            samples, "idemctl_store_call_duration_seconds_count", store="redis", op="claim"
        )
        completes = value(
            samples, "idemctl_store_call_duration_seconds_count", store="redis", op="complete"
        )
        assert claims >= 3 and completes >= 2  # 51 messages in batches of 20 at most
        assert value(samples, "idemctl_in_flight_leases") == 0  # all completed, none held
        assert value(samples, "idemctl_assigned_partitions") == 2
        info = [k for k in samples if k[0] == "idemctl_build_info"]
        assert info and dict(info[0][1])["store"] == "redis"
        assert probe(port, "/healthz") == (200, "ok\n")
        assert probe(port, "/readyz") == (200, "ready\n")
        # The Grafana dashboard in examples/ asks only for what consume exposes (the lag
        # where the broker reports it; the relay's own names in the relay's tests).
        wanted = dashboard_metrics() - {"idemctl_lag_messages"}
        exposed = {name for name, _ in samples}
        assert {m for m in wanted if not m.startswith("idemctl_outbox_")} <= exposed

        server.stop()  # the store goes down: alive, but not ready
        status, why = probe(port, "/readyz")
        assert status == 503 and why.startswith("store unreachable"), why
        assert probe(port, "/healthz")[0] == 200
        server.start()
        wait_until("ready again", lambda: probe(port, "/readyz")[0] == 200, 30)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        server.stop()
    assert proc.returncode == 0, err
    assert json.loads(out)["counts"]["executed"] == 40


def _answers(port: int) -> bool:
    try:
        return probe(port, "/healthz")[0] == 200
    except OSError:
        return False
