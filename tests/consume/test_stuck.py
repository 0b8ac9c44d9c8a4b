"""A handler that never returns, on the real broker and Redis: reported at once (/readyz 503
naming its key, the overdue metric, a warning with its stack), passed by (the other
partitions go on; past the hard limit its key is failed as timed out, then dead-lettered
after --max-attempts), and drained (SIGTERM exits 9 within --drain-timeout, leaving its
message uncommitted). Alone, with --concurrency 3 and with --processes 2."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from idemctl import open_store
from idemctl.consume import Consumer
from idemctl.consume.event import Event
from idemctl.errors import HandlerTimeout
from idemctl.runner import Context
from tests.consume.test_consume import committed, names, options, read_all
from tests.consume.test_processes import Run
from tests.polling import wait_until
from tests.scrape import probe, scrape
from tests.servers import KafkaBroker, RedisServer, free_port

STUCK = """\
import os, time


def handle(event, ctx):
    def note(what):
        fd = os.open("effects.txt", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, f"{ctx.key} {what} {ctx.attempt}\\n".encode())
        finally:
            os.close(fd)

    note("start")
    if ctx.key.startswith("stuck"):
        time.sleep(10**6)  # a call that never returns, and never sees HandlerTimeout
    note("done")
"""


def _produce(broker: KafkaBroker, topic: str, messages: list[tuple[int, str]]) -> None:
    """Each (partition, idempotency key) to its partition."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for partition, key in messages:
        value = json.dumps({"key": key}).encode()
        producer.produce(topic, value, partition=partition, headers=[("idempotency-key", key)])
    assert producer.flush(30) == 0


MODES = {"alone": [], "concurrency": ["--concurrency", "3"], "processes": ["--processes", "2"]}
"""Consume's options for each way a stuck handler is tried: one lane, three, two processes."""


def stuck_topic(broker: KafkaBroker, tmp_path: Path) -> tuple[str, str, list[tuple[int, str]]]:
    """A topic of 3 partitions whose partition 0 holds a key that hangs (``stuck-1``, with
    ``STUCK`` as the handler in ``tmp_path``) between two others, and 20 keys on each of
    partitions 1 and 2: its name, a new group, and the (partition, key) pairs produced."""
    (tmp_path / "stuck.py").write_text(STUCK)
    topic, group = names()
    broker.create_topic(topic, partitions=3)
    first = [(0, "a-0"), (0, "stuck-1"), (0, "a-1")]
    first += [(p, f"b{p}-{i}") for p in (1, 2) for i in range(20)]
    _produce(broker, topic, first)
    return topic, group, first


def _lines(tmp_path: Path) -> list[tuple[str, str, int]]:
    path = tmp_path / "effects.txt"
    text = path.read_text() if path.exists() else ""
    return [(k, what, int(n)) for k, what, n in (line.split() for line in text.splitlines())]


def _wait(what: str, check: Any, timeout: float, run: Run) -> float:
    """Seconds until ``check()`` held (fails after ``timeout``, with the run's log)."""
    started = time.monotonic()

    def looked() -> bool:
        run.seen += [run.lines.get() for _ in range(run.lines.qsize())]  # the log so far
        return bool(check())

    wait_until(looked, what, timeout, interval=0.2, procs=[run.proc], detail=run.stderr)
    return time.monotonic() - started


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["alone", "concurrency", "processes"])
def test_a_handler_that_never_returns_is_reported_passed_by_and_drained(
    mode: str, kafka_broker: KafkaBroker, redis_server: RedisServer, tmp_path: Path
) -> None:
    topic, group, first = stuck_topic(kafka_broker, tmp_path)
    port = free_port()
    url = redis_server.url(query=f"prefix=s-{tmp_path.name[-8:]}:")
    run = Run(kafka_broker, url, topic, group, tmp_path,
              "--handler", "stuck:handle", "--stall-timeout", "5s", "--handler-timeout", "10s",
              "--handler-grace", "2s", "--max-attempts", "2", "--drain-timeout", "5s",
              "--metrics-port", str(port), "--metrics-host", "127.0.0.1", *MODES[mode])  # fmt: skip
    try:
        done = lambda: {k for k, what, _ in _lines(tmp_path) if what == "done"}  # noqa: E731
        _wait("stuck", lambda: ("stuck-1", "start", 1) in _lines(tmp_path), 90, run)
        hung = time.monotonic()
        # Reported within 15 s: /readyz 503 naming the key, the gauges, the stack.
        _wait("unready", lambda: "'stuck-1'" in probe(port, "/readyz")[1], 15, run)
        status, body = probe(port, "/readyz")
        assert status == 503 and f"{topic}[0]@1" in body and "--stall-timeout 5s" in body
        samples, _ = scrape(port)
        assert samples[("idemctl_handlers_overdue", ())] >= 1
        assert samples[("idemctl_stalled_partitions", ())] >= 1
        (warning,) = run.wait_for(r"'stuck-1'.*past --stall-timeout", timeout=5)
        assert "its thread is at" in warning["msg"] and "time.sleep(10**6)" in warning["msg"]
        # Passed by: partitions 1 and 2 go on, with messages produced after the hang began.
        later = [(p, f"c{p}-{i}") for p in (1, 2) for i in range(10)]
        _produce(kafka_broker, topic, later)
        others = {k for _, k in first + later if not k.startswith(("a", "stuck"))}
        _wait("the other partitions", lambda: others <= done(), 60 - (time.monotonic() - hung),
              run)  # fmt: skip
        # Timed out twice (--max-attempts 2): dead-lettered, and partition 0 goes past it.
        _wait("a-1 past the dead letter", lambda: "a-1" in done(), 90, run)
        letters = read_all(kafka_broker, f"{topic}.dlq", 1)
        said = [{k: v.decode() for k, v in m.headers() or ()} for m in letters]
        assert len(letters) == 1, f"{said}\n{run.stderr()}"
        headers = said[0]
        if headers["idemctl-dlt-reason"] == "failed before":
            # --processes: partition 0 moved to a fresh worker while the second attempt hung;
            # the worker that timed it out left the letter to it (CI: one from each).
            assert mode == "processes", headers
            assert "HandlerTimeout: " in headers["kafka_dlt-exception-message"]
        else:
            assert headers["kafka_dlt-exception-fqcn"] == "idemctl.errors.HandlerTimeout"
        assert "hard limit 12s" in headers["kafka_dlt-exception-message"]
        starts = Counter(k for k, what, _ in _lines(tmp_path) if what == "start")
        assert starts["stuck-1"] == 2  # two timed-out attempts, then not run again
        assert max(n for k, n in starts.items() if k != "stuck-1") == 1
        # Drained: a key stuck at SIGTERM is left uncommitted, and the run exits 9 in time.
        _produce(kafka_broker, topic, [(0, "stuck-2")])
        _wait("stuck again", lambda: ("stuck-2", "start", 1) in _lines(tmp_path), 60, run)
        run.proc.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        code, _ = run.finish(timeout=30)
        assert time.monotonic() - stopped < 30
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
    assert code == 9, run.stderr()
    assert any("'stuck-2'" in str(x.get("msg")) for x in run.seen), run.stderr()
    # Partition 0: a-0, stuck-1 (dead-lettered), a-1 committed; stuck-2 (offset 3) is not.
    assert committed(kafka_broker, topic, group, 3) == {0: 3, 1: 30, 2: 30}


def test_an_abandoned_handlers_late_result_is_refused(
    kafka_broker: KafkaBroker, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler abandoned past its hard limit comes back after its key was failed as timed
    out and run again: the store refuses its result (its fencing token no longer holds the
    key), so the key keeps the retry's result and the late effect is never recorded."""
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    _produce(kafka_broker, topic, [(0, "late")])
    release = threading.Event()
    effects: list[int] = []

    def handler(event: Event, ctx: Context) -> dict[str, int]:
        if ctx.attempt == 1:
            # Blocks in C, so the soft limit's HandlerTimeout waits for it; then swallowed,
            # as a careless handler may: it returns a result, late.
            with contextlib.suppress(HandlerTimeout):
                release.wait()
        effects.append(ctx.attempt)
        return {"attempt": ctx.attempt}

    url = redis_server.url(query=f"prefix=late-{names()[0]}:")
    with open_store(url) as store:
        opts = options(kafka_broker, topic, group, stall_timeout=0.5, handler_timeout=0.5,
                       handler_grace=0.5, exit_when_idle=None)  # fmt: skip
        consumer = Consumer(store, handler, opts)
        running = threading.Thread(target=consumer.run, daemon=True)
        running.start()
        try:

            def completed() -> bool:
                record = store.get("late")
                return record is not None and record.status.value == "completed"

            wait_until(lambda: completed() or not running.is_alive(), "'late' completed",
                       detail=lambda: repr(store.get("late")))  # fmt: skip
            record = store.get("late")
            assert record is not None and record.status.value == "completed", record
            assert record.result == {"attempt": 2} and effects == [2]
            release.set()  # the abandoned attempt returns now, and tries to complete
            wait_until(lambda: any("refused its result" in r.getMessage() for r in caplog.records),
                       "the store refused the late result",
                       detail=lambda: repr([r.getMessage() for r in caplog.records]))  # fmt: skip
        finally:
            consumer.stop()
            running.join(30)
        after = store.get("late")
    assert after is not None and after.result == {"attempt": 2} and after.attempts == 2
    assert effects == [2, 1]  # the late one happened in the handler, and was never stored
    assert consumer.summary.counts["executed"] == 1 and consumer.summary.counts["retried"] == 1
    assert committed(kafka_broker, topic, group, 1) == {0: 1}


def test_a_handler_that_is_merely_slow_runs_once_and_is_never_reported(
    kafka_broker: KafkaBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """5 s, under every limit: one run, completed, no warning, no overdue handler."""
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    _produce(kafka_broker, topic, [(0, "slow"), (0, "quick")])
    ran: Counter[str] = Counter()
    seen_overdue: list[int] = []

    def handler(event: Event, ctx: Context) -> None:
        ran[ctx.key] += 1
        if ctx.key == "slow":
            time.sleep(5)

    with open_store(f"sqlite:///{tmp_path}/keys.db") as store:
        opts = options(kafka_broker, topic, group, stall_timeout=30.0, handler_timeout=60.0)
        consumer = Consumer(store, handler, opts,
                            on_progress=lambda s: seen_overdue.append(s.overdue))  # fmt: skip
        summary = consumer.run()
    assert ran == {"slow": 1, "quick": 1} and summary.counts["executed"] == 2
    assert not any(r.levelname == "WARNING" for r in caplog.records), caplog.text
    assert seen_overdue and max(seen_overdue) == 0
