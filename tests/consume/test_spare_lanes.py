"""A stuck handler holds up only its own partition, at consume's defaults (no time-limit
option given), on the real broker and Redis: once it is overdue (--stall-timeout, 10 s),
the other partitions of its lane go on in another lane, a spare one where every lane is
taken, alone, with --concurrency 3 and with --processes 2; its own partition waits, in
order. A slow handler under every limit starts no spare lane and is not reported."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.consume.test_consume import names
from tests.consume.test_processes import Run
from tests.consume.test_stuck import MODES, STUCK, _lines, _produce, _wait, stuck_topic
from tests.polling import wait_until
from tests.scrape import probe
from tests.servers import KafkaBroker, RedisServer, free_port

SLOW = STUCK.replace("time.sleep(10**6)", "time.sleep(5)")  # slow, under every limit


def _consume(kafka_broker: KafkaBroker, redis_server: RedisServer, tmp_path: Path, topic: str,
             group: str, port: int, *more: str) -> Run:  # fmt: skip
    url = redis_server.url(query=f"prefix=v-{tmp_path.name[-8:]}:")
    return Run(kafka_broker, url, topic, group, tmp_path, "--handler", "stuck:handle",
               "--drain-timeout", "2s", "--metrics-port", str(port), "--metrics-host",
               "127.0.0.1", *more)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["alone", "concurrency", "processes"])
def test_a_stuck_handler_holds_up_only_its_own_partition_at_the_defaults(
    mode: str, kafka_broker: KafkaBroker, redis_server: RedisServer, tmp_path: Path
) -> None:
    topic, group, first = stuck_topic(kafka_broker, tmp_path)
    port = free_port()
    run = _consume(kafka_broker, redis_server, tmp_path, topic, group, port, *MODES[mode])
    try:
        done = lambda: {k for k, what, _ in _lines(tmp_path) if what == "done"}  # noqa: E731
        _wait("stuck", lambda: ("stuck-1", "start", 1) in _lines(tmp_path), 90, run)
        hung = time.monotonic()
        later = [(p, f"c{p}-{i}") for p in (1, 2) for i in range(25)]  # after the hang began
        _produce(kafka_broker, topic, later)
        others = {k for _, k in first + later if not k.startswith(("a", "stuck"))}
        _wait("the other partitions", lambda: others <= done(), 20 - (time.monotonic() - hung),
              run)  # fmt: skip
        unready = lambda: probe(port, "/readyz")  # noqa: E731
        _wait("unready", lambda: "'stuck-1'" in unready()[1], 20 - (time.monotonic() - hung), run)
        status, body = unready()
        assert status == 503 and f"{topic}[0]@1" in body and "--stall-timeout 10s" in body, body
        assert "a-1" not in done()  # its partition keeps its order: behind the stuck key
        starts = Counter(k for k, what, _ in _lines(tmp_path) if what == "start")
        assert max(starts.values()) == 1, starts
        if mode != "concurrency":  # with 3 lanes the other partitions' lanes may be free
            run.wait_for(r"spare lane idemctl-handler-\d+ started", timeout=5)
    finally:
        if run.proc.poll() is None:
            run.proc.send_signal(signal.SIGTERM)
            run.finish(timeout=60)


@pytest.mark.slow
def test_a_slow_handler_under_every_limit_starts_no_spare_lane(
    kafka_broker: KafkaBroker, redis_server: RedisServer, tmp_path: Path
) -> None:
    (tmp_path / "stuck.py").write_text(SLOW)
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=3)
    keys = [(0, "stuck-1"), (0, "a-1")] + [(p, f"b{p}-{i}") for p in (1, 2) for i in range(5)]
    _produce(kafka_broker, topic, keys)
    port = free_port()
    run = _consume(kafka_broker, redis_server, tmp_path, topic, group, port)
    try:
        done = lambda: {k for k, what, _ in _lines(tmp_path) if what == "done"}  # noqa: E731
        readiness = []

        def all_done() -> bool:
            running = {k for k, _, _ in _lines(tmp_path)} - done()
            if "stuck-1" in running:  # the slow handler runs: ready all the same
                readiness.append(probe(port, "/readyz"))
            return {k for _, k in keys} <= done()

        wait_until(all_done, "every key done", 90, 0.3, procs=[run.proc], detail=run.stderr)
        run.proc.send_signal(signal.SIGTERM)
        code, summary = run.finish(timeout=60)
        assert code == 0, run.stderr()
        starts = Counter(k for k, what, _ in _lines(tmp_path) if what == "start")
        assert set(starts.values()) == {1}, starts
        said = [str(line.get("msg")) for line in run.seen]
        assert not [m for m in said if "spare lane" in m or "overdue" in m or "past --" in m]
        assert readiness and {status for status, _ in readiness} == {200}, readiness
        assert summary["counts"]["executed"] == len(keys), summary
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
