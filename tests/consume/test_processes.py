"""``idemctl consume --processes N`` on the real broker: worker processes of one group, a
SIGKILLed worker replaced, every key run (none more than twice), a worker that cannot
start stopping the command within seconds, SIGTERM draining every worker into one
summary, and one /metrics for the whole."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.consume.test_consume import REPO, committed, kafka_flags, names, produce
from tests.polling import wait_until
from tests.scrape import probe, scrape
from tests.servers import KafkaBroker, free_port

LEDGER = """\
import os, time


def handle(event, ctx):
    fd = os.open("effects.txt", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{ctx.key} start {os.getpid()}\\n".encode())
        time.sleep(float(os.environ.get("HANDLER_SLEEP", "0.005")))
        os.write(fd, f"{ctx.key} done {os.getpid()}\\n".encode())
    finally:
        os.close(fd)
    return {"pid": os.getpid()}
"""


class Run:
    """An ``idemctl consume --processes`` process, its stderr read line by line."""

    def __init__(self, broker: KafkaBroker, url: str, topic: str, group: str, cwd: Path,
                 *options: str, env: dict[str, str] | None = None) -> None:  # fmt: skip
        command = [
            sys.executable, "-m", "idemctl", "--store", url, "consume",
            "--brokers", broker.bootstrap, "--topic", topic, "--group", group,
            "--handler", "ledger:handle", "--json", "--log-format", "json",
            "--backoff", "200ms", *kafka_flags(broker), *options,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        )  # fmt: skip
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            try:
                line = json.loads(raw)
            except ValueError:
                line = {"msg": raw.rstrip(), "raw": True}
            self.lines.put(line)

    def wait_for(self, pattern: str, count: int = 1, timeout: float = 90) -> list[dict[str, Any]]:
        """The first ``count`` lines whose msg matches ``pattern``."""
        deadline = time.monotonic() + timeout
        while len(found := [x for x in self.seen if re.search(pattern, str(x.get("msg")))]) < count:
            left = deadline - time.monotonic()
            assert (left > 0 and self.proc.poll() is None) or not self.lines.empty(), (
                f"no {count} x {pattern!r}: " + "\n".join(str(x) for x in self.seen[-30:])
            )
            with contextlib.suppress(queue.Empty):
                self.seen.append(self.lines.get(timeout=max(min(left, 1.0), 0.01)))
        return found[:count]

    def finish(self, timeout: float = 120) -> tuple[int, dict[str, Any]]:
        """Its exit status and its summary, once it exits (stderr stays the reader's)."""
        assert self.proc.stdout is not None
        out: list[str] = []
        stdout = threading.Thread(target=lambda: out.append(self.proc.stdout.read()))  # type: ignore[union-attr]
        stdout.start()
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        stdout.join(timeout=10)
        self.reader.join(timeout=10)  # every line it wrote, read
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        text = "".join(out)
        return self.proc.returncode, (json.loads(text) if text.strip() else {})

    def stderr(self) -> str:
        return "\n".join(str(x) for x in self.seen[-40:])


def store_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/keys.db"
    server = request.getfixturevalue("redis_server")
    return str(server.url(query=f"prefix=p-{tmp_path.name[-8:]}:"))


def done_lines(tmp_path: Path) -> list[list[str]]:
    """The ledger's lines marked done, split: key, "done", PID."""
    path = tmp_path / "effects.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return [parts for parts in map(str.split, lines) if parts[1] == "done"]


def effects(tmp_path: Path) -> Counter[str]:
    """Each key's finished handler runs."""
    return Counter(key for key, _, _ in done_lines(tmp_path))


def done_by(tmp_path: Path) -> Counter[int]:
    """Finished handler runs per process."""
    return Counter(int(pid) for _, _, pid in done_lines(tmp_path))


def until(check: Any, run: Run, timeout: float = 60) -> None:
    """``check`` within ``timeout``, with the run's log if not (tests/polling.py)."""
    wait_until(check, "the workers' progress", timeout, 0.1, detail=run.stderr)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_two_workers_share_the_group_and_a_killed_one_is_replaced(
    kafka_broker: KafkaBroker, tmp_path: Path, request: pytest.FixtureRequest, kind: str
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=4)
    (tmp_path / "ledger.py").write_text(LEDGER)
    keys = [f"k-{i}" for i in range(400)]
    messages = [{"value": {"n": i}, "idem": k, "kkey": k.encode()} for i, k in enumerate(keys)]
    produce(kafka_broker, topic, messages + messages[:80])  # duplicates, same partitions
    run = Run(kafka_broker, store_url(kind, tmp_path, request), topic, group, tmp_path,
              "--processes", "2", "--exit-when-idle", "8s", "--batch-size", "10",
              "--lease", "2s", env={"HANDLER_SLEEP": "0.02"})  # fmt: skip
    started = run.wait_for(r"^worker \d started", 2)
    assert {line["worker"] for line in started} == {0, 1}
    pids = {line["worker"]: line["pid"] for line in started}
    # the two share the group's work before the kill: handlers finished in both processes
    both = set(pids.values())
    until(lambda: sum(effects(tmp_path).values()) >= 60 and set(done_by(tmp_path)) >= both, run)
    victim = pids[0]
    os.kill(victim, signal.SIGKILL)  # mid-run
    run.wait_for(r"^worker 0 killed by signal 9")
    replacement = run.wait_for(r"^worker 0 started", 2)[1]
    assert replacement["pid"] != victim
    rc, report = run.finish()
    assert rc == 0, run.stderr()
    ran = effects(tmp_path)
    assert set(ran) == set(keys)  # every key ran...
    assert max(ran.values()) <= 2  # ...and none more than twice (the kill's window)
    assert report["processes"] == 2
    assert [w["restarts"] for w in report["workers"]] == [1, 0]
    # the worker never killed reports what it did exactly (a killed one's counts end at its
    # last progress line): some of it, and no more runs stored than its handlers finished
    kept = report["workers"][1]["counts"].get("executed", 0)
    assert 0 < kept <= done_by(tmp_path)[pids[1]], report["workers"]
    assert report["counts"]["executed"] + report["counts"].get("replayed", 0) >= 480 - 80
    assert sum(committed(kafka_broker, topic, group, 4).values()) == 480  # all of them


def finished(offsets: dict[int, int]) -> int:
    """Messages committed past, over the partitions (one with nothing committed is -1001)."""
    return sum(max(offset, 0) for offset in offsets.values())


@pytest.mark.parametrize(
    ("failure", "code", "says"),
    [
        ("raise ImportError('no such module: payments_v2')", 2, r"worker \d exited 2"),
        ("os._exit(1)", 1, r"crash loop: 5 worker deaths within 60s"),
    ],
)
def test_a_worker_that_cannot_start_stops_the_command_within_seconds(
    kafka_broker: KafkaBroker, tmp_path: Path, failure: str, code: int, says: str
) -> None:
    """The handler imports in the supervisor (which checks it) and fails in every worker."""
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=2)
    (tmp_path / "ledger.py").write_text(
        f"import os\nif 'IDEMCTL_WORKER_INDEX' in os.environ:\n    {failure}\n" + LEDGER
    )
    started = time.monotonic()
    run = Run(kafka_broker, f"sqlite:///{tmp_path}/keys.db", topic, group, tmp_path,
              "--processes", "2")  # fmt: skip
    rc, _ = run.finish(timeout=60)
    took = time.monotonic() - started
    assert rc == code, run.stderr()
    assert took < 45, took  # not a loop for ever
    errors = [x for x in run.seen if x.get("level") == "error"]
    assert errors and re.search(says, str(errors[-1]["msg"])), run.stderr()


@pytest.mark.slow
def test_sigterm_drains_every_worker_into_one_summary_and_one_metrics_endpoint(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=4)
    (tmp_path / "ledger.py").write_text(LEDGER)
    produce(kafka_broker, topic, [{"value": {"n": i}, "idem": f"s-{i}", "kkey": f"s-{i}".encode()}
                                  for i in range(80)])  # fmt: skip
    port = free_port()
    run = Run(kafka_broker, f"sqlite:///{tmp_path}/keys.db", topic, group, tmp_path,
              "--processes", "2", "--batch-size", "1", "--metrics-port", str(port),
              "--metrics-host", "127.0.0.1", env={"HANDLER_SLEEP": "0.3"})  # fmt: skip
    until(lambda: len(effects(tmp_path)) >= 4, run, timeout=90)
    for line in run.wait_for(r"^worker \d started", 2):  # ps and top tell them apart
        comm = Path(f"/proc/{line['pid']}/comm")
        assert comm.read_text().strip() == f"idemctl-w{line['worker']}"
    # Both workers joined and hold the 4 partitions between them: the one /readyz says so.
    until(lambda: probe(port, "/readyz") == (200, "ready\n"), run, timeout=30)
    samples, types = scrape(port)  # the two workers' metrics, summed
    assert samples[("idemctl_messages_total", (("outcome", "executed"),))] >= 1
    assert samples[("idemctl_assigned_partitions", ())] == 4
    assert types["idemctl_handler_duration_seconds"] == "histogram"
    assert probe(port, "/healthz")[0] == 200
    run.proc.send_signal(signal.SIGTERM)
    rc, report = run.finish()
    assert rc == 0, run.stderr()
    lines = (tmp_path / "effects.txt").read_text().splitlines()
    started = Counter(line.split()[0] for line in lines if " start " in line)
    assert started == effects(tmp_path)  # every handler in hand finished: none cut off
    assert report["counts"]["executed"] == sum(started.values())
    assert len(report["workers"]) == 2
    assert finished(committed(kafka_broker, topic, group, 4)) == sum(started.values())


def test_max_messages_and_a_bad_process_count_are_refused(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from idemctl.cli import app

    base = ["--store", f"sqlite:///{tmp_path}/k.db", "consume", "--topic", "t", "--group", "g",
            "--handler", "json:loads"]  # fmt: skip
    for extra, says in (
        (["--processes", "2", "--max-messages", "10"], "--max-messages counts one process"),
        (["--processes", "0"], "--processes 0: use a whole number"),
        (["--processes", "many"], "--processes many: use a whole number"),
    ):
        result = CliRunner().invoke(app, base + extra)
        assert result.exit_code == 2, result.output
        assert says in result.output
