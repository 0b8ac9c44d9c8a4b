"""`idemctl demo` as a newcomer runs it: a real subprocess, its own local broker (or the
one given), a consumer killed mid-run, the other stopped mid-charge past its lease, and a
verdict that every payment was charged once: the stopped one's late charge refused by its
token (fenced), or a second charge (--unfenced)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.backends import unique_prefix
from tests.servers import KafkaBroker

REPO = Path(__file__).resolve().parents[2]


def demo(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IDEMCTL_")}
    return subprocess.run(
        [sys.executable, "-m", "idemctl", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def check(report: dict[str, Any], payments: int) -> None:
    assert report["ok"] is True
    assert report["fenced"] is True
    assert report["never_charged"] == []  # no payment lost
    assert report["charged_twice"] == []  # the stopped consumer's late charge is refused
    assert report["charged_once"] == payments
    assert report["messages"] == int(payments * 1.3)
    assert report["kills"] == 1
    # the zombie (its payment three quarters in, charged after the kill) was stopped
    assert report["stopped"] == 1 and report["late_charges_refused"] == 1


def test_demo_on_the_embedded_defaults(tmp_path: Path) -> None:
    human = demo("demo", "--payments", "200")
    assert human.returncode == 0, human.stderr
    assert "Each payment's charges" in human.stdout
    assert "killed one consumer mid-run (SIGKILL)" in human.stderr
    assert "ok:" in human.stderr
    row = next(ln for ln in human.stdout.splitlines() if ln.strip().startswith("│"))
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[:3] == ["200", "260", "1"]
    assert cells[3:7] == ["1", "200", "0", "0"]  # stopped, once, twice (fenced), never
    assert "(SIGSTOP) past its lease" in human.stderr  # then resumed after a takeover
    assert "1 late charge(s) of the stopped consumer" in human.stderr  # and refused


def test_demo_on_a_given_broker_and_store(kafka_broker: KafkaBroker, redis_server: Any) -> None:
    url = f"redis://127.0.0.1:{redis_server.port}/0?prefix={unique_prefix()}"
    result = demo(
        "--store", url, "demo", "--brokers", kafka_broker.bootstrap, "--payments", "150", "--json"
    )
    assert result.returncode == 0, result.stderr
    check(json.loads(result.stdout), 150)
    assert f"broker {kafka_broker.bootstrap}" in result.stderr


def test_demo_finds_the_payments_handler_outside_the_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from idemctl.harness.demo import examples_dir

    monkeypatch.chdir(tmp_path)  # no examples/ here: the checkout's
    assert examples_dir() == REPO / "examples"


def test_the_demo_report_allows_repeats_only_unfenced() -> None:
    from collections import Counter

    from idemctl.harness.demo import DemoReport

    keys = ["a", "b"]
    twice = DemoReport("t", 2, 2, 1, Counter(a=2, b=1), keys, fenced=False)
    assert twice.twice == ["a"] and twice.ok  # a kill may repeat a charge unfenced
    fenced = DemoReport("t", 2, 2, 1, Counter(a=2, b=1), keys, fenced=True)
    assert not fenced.ok  # fenced, one repeat fails the run
    retaken = DemoReport("t", 2, 2, 1, Counter(a=1, b=1), keys, True, Counter(a=2, b=1), 1)
    assert retaken.ok and retaken.retaken == ["a"] and retaken.refused == 1


def test_the_kill_spares_the_stopped_consumer(tmp_path: Path) -> None:
    """The stop can come before the kill (the zombie's payment on a partition that ran
    ahead): the kill then hits the other consumer, or the stopped one, killed, never
    charges late and its SIGCONT raised ProcessLookupError (seen in a full run)."""
    from types import SimpleNamespace

    from idemctl.harness.demo import _victim, _Zombie

    consumers: Any = [SimpleNamespace(pid=101), SimpleNamespace(pid=102)]
    zombie = _Zombie("k", tmp_path, None)
    assert _victim(consumers, zombie) == 0  # no stop yet: the first
    zombie.pid, zombie.stopped = 101, True
    assert _victim(consumers, zombie) == 1
    zombie.pid = 102
    assert _victim(consumers, zombie) == 0
