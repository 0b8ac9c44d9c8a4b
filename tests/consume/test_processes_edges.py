"""``consume --processes`` at its edges, on the real broker: static membership gives each
worker slot an id of its own; a setting librdkafka refuses stops the command before the
store or a worker is touched; the merged /metrics counters never go down when a worker is
replaced and end at what was run; the supervisor's temporary directory does not outlive
it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from idemctl.cli.workers import OWNER, WORKERS_DIR, remove_orphans
from tests.consume.test_consume import REPO, names, produce
from tests.consume.test_processes import LEDGER, Run, effects, until
from tests.scrape import scrape
from tests.servers import KafkaBroker, free_port

EXECUTED = ("idemctl_messages_total", (("outcome", "executed"),))


def messages(prefix: str, n: int) -> list[dict[str, object]]:
    return [{"value": {"n": i}, "idem": f"{prefix}-{i}", "kkey": f"{prefix}-{i}".encode()}
            for i in range(n)]  # fmt: skip


def test_each_worker_is_a_static_member_of_its_own(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """With one group.instance.id for all, the broker gave both workers every partition and
    every message was handled twice (replayed by the second); with -w<index> each once."""
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=4)
    (tmp_path / "ledger.py").write_text(LEDGER)
    produce(kafka_broker, topic, messages("m", 200))
    run = Run(kafka_broker, f"sqlite:///{tmp_path}/keys.db", topic, group, tmp_path,
              "--processes", "2", "--exit-when-idle", "6s",
              "--kafka-config", f"group.instance.id=billing-{group}")  # fmt: skip
    rc, report = run.finish(timeout=180)
    assert rc == 0, run.stderr()
    assert sum(effects(tmp_path).values()) == 200
    handled = [w["counts"].get("executed", 0) + w["counts"].get("replayed", 0)
               for w in report["workers"]]  # fmt: skip
    assert sum(handled) < 300, report  # twice would be 400: each worker read every message


def test_a_refused_kafka_setting_stops_before_the_store_or_a_worker(tmp_path: Path) -> None:
    db = tmp_path / "keys.db"
    done = subprocess.run(
        [sys.executable, "-m", "idemctl", "--store", f"sqlite:///{db}", "consume",
         "--topic", "t", "--group", "g", "--handler", "json:loads", "--brokers", "127.0.0.1:9",
         "--processes", "2", "--kafka-config", "no.such.setting=1"],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "no.such.setting" in errors[0], done.stderr
    assert "worker" not in done.stderr and "store:" not in done.stderr
    assert not db.exists()


@pytest.mark.slow
def test_merged_counters_never_go_down_when_a_worker_is_replaced(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=4)
    (tmp_path / "ledger.py").write_text(LEDGER)
    produce(kafka_broker, topic, messages("a", 120))
    port = free_port()
    run = Run(kafka_broker, f"sqlite:///{tmp_path}/keys.db", topic, group, tmp_path,
              "--processes", "2", "--metrics-port", str(port),
              "--metrics-host", "127.0.0.1")  # fmt: skip
    seen: list[float] = []

    def executed() -> float:
        value = scrape(port)[0].get(EXECUTED, 0.0)
        assert not seen or value >= seen[-1], (seen[-5:], value)  # a counter never goes down
        seen.append(value)
        return value

    def reported(n: int) -> bool:
        """The supervisor's progress line says ``n`` executed: each worker's last report
        (once a second) holds its figures, so a kill now loses none of them."""
        while not run.lines.empty():
            run.seen.append(run.lines.get())
        return any(x.get("msg") == "consume progress" and x.get("executed") == n for x in run.seen)

    started = {x["worker"]: x["pid"] for x in run.wait_for(r"^worker \d started", 2)}
    until(lambda: executed() == 120, run, timeout=120)  # both workers' figures, all in
    until(lambda: reported(120), run, timeout=60)
    os.kill(started[0], signal.SIGKILL)
    run.wait_for(r"^worker 0 killed by signal 9")
    run.wait_for(r"^worker 0 started", 2)
    assert executed() == 120  # the dead worker's share is still counted
    produce(kafka_broker, topic, messages("b", 80))
    until(lambda: executed() == 200, run, timeout=120)
    assert sum(effects(tmp_path).values()) == 200
    run.proc.send_signal(signal.SIGTERM)
    rc, report = run.finish()
    assert rc == 0, run.stderr()
    assert report["counts"]["executed"] == 200, report["workers"]  # the --json totals
    assert [w["restarts"] for w in report["workers"]] == [1, 0]


def test_a_killed_supervisors_directory_is_removed_by_a_later_run(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=2)
    (tmp_path / "ledger.py").write_text(LEDGER)
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {"TMPDIR": str(temp)}
    run = Run(kafka_broker, f"sqlite:///{tmp_path}/keys.db", topic, group, tmp_path,
              "--processes", "2", env=env)  # fmt: skip
    run.wait_for(r"^worker \d started", 2)
    [folder] = temp.glob(WORKERS_DIR + "*")
    assert (folder / OWNER).read_text() == str(run.proc.pid)
    run.proc.kill()  # SIGKILL: nothing of its own runs
    run.finish()
    assert folder.exists()
    assert remove_orphans(str(temp)) == [folder]  # what every later run does first
    assert not folder.exists()

    again = Run(kafka_broker, f"sqlite:///{tmp_path}/keys.db", topic, group, tmp_path,
                "--processes", "2", env=env)  # fmt: skip
    again.wait_for(r"^worker \d started", 2)
    [live] = temp.glob(WORKERS_DIR + "*")
    assert remove_orphans(str(temp)) == []  # a running supervisor's is left alone
    again.proc.send_signal(signal.SIGTERM)
    rc, _ = again.finish()
    assert rc == 0, again.stderr()
    assert not live.exists()  # removed on its own way out


def test_only_dead_supervisors_directories_are_removed(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = Path(tempfile.mkdtemp(prefix=WORKERS_DIR, dir=tmp_path))
    (dead / OWNER).write_text(str(gone.pid))
    alive = Path(tempfile.mkdtemp(prefix=WORKERS_DIR, dir=tmp_path))
    (alive / OWNER).write_text(str(os.getpid()))
    unnamed = Path(tempfile.mkdtemp(prefix=WORKERS_DIR, dir=tmp_path))
    other = tmp_path / "something-else"
    other.mkdir()
    assert remove_orphans(str(tmp_path)) == [dead]
    assert alive.exists() and unnamed.exists() and other.exists()
