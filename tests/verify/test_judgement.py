"""verify's judgement and scratch names, without servers."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from idemctl.errors import ConfigError
from idemctl.harness.scratch import Scratch, with_option
from idemctl.harness.verify import consumers as processes
from idemctl.harness.verify.consumers import _Consumers
from idemctl.harness.verify.plan import (
    REBALANCE_EVERY,
    STALLED,
    Effect,
    Fault,
    Plan,
    VerifyReport,
    _Chaos,
    _Messages,
    judge,
    percentile,
)
from tests.polling import wait_until

PLAN = Plan("sqlite:///x.db", "127.0.0.1:9092", batch_size=2, lease=5.0)


def effect(key: str, pid: int, at: float) -> Effect:
    return Effect(key, pid, at - 0.1, at)


def test_only_the_effects_a_kill_cut_off_are_allowed_and_at_most_so_many_a_kill() -> None:
    effects = [
        effect("a", 10, 1.0), effect("a", 20, 5.0),  # 10 killed at 2.0: explained
        effect("b", 10, 1.5), effect("b", 20, 6.0),  # the same kill: explained
        effect("c", 10, 1.8), effect("c", 20, 7.0),  # a third for that kill: over 2 a kill
        effect("d", 30, 1.0), effect("d", 20, 8.0),  # 30 was never killed: unexplained
        effect("e", 40, 9.0), effect("e", 20, 9.5),  # 40 killed before it wrote: unexplained
        effect("f", 20, 3.0),  # once: no duplicate
    ]  # fmt: skip
    killed = {10: 2.0, 40: 4.0}
    duplicates, allowed, unexplained, mid_handler = judge(effects, killed, [], PLAN, most=2)
    assert (duplicates, allowed, unexplained, mid_handler) == (5, 2, 3, 1)


def test_transactional_mode_allows_no_duplicate_even_after_a_kill() -> None:
    plan = Plan("postgresql://h/db", "b", transactional=True)
    effects = [effect("a", 10, 1.0), effect("a", 20, 5.0)]
    assert judge(effects, {10: 2.0}, [], plan) == (1, 0, 1, 1)


def test_a_store_fault_explains_effects_from_a_lease_before_it_to_its_end() -> None:
    fault = Fault("pause", 3.0, started=100.0, ended=103.0)
    effects = [
        effect("a", 10, 96.0), effect("a", 20, 110.0),  # within the lease before: explained
        effect("b", 10, 94.0), effect("b", 20, 111.0),  # longer before: unexplained
        effect("c", 10, 104.0), effect("c", 20, 112.0),  # after it: unexplained
    ]  # fmt: skip
    assert judge(effects, {}, [fault], PLAN) == (3, 1, 2, 0)


def test_the_report_names_each_broken_promise() -> None:
    report = VerifyReport("r", "t", "s", "m", "g", 10, 5, 1, 1, 2)
    assert report.ok and report.problems == []
    report.lost = ["k1"]
    report.duplicate_effects, report.duplicates_allowed = 3, 1
    report.poison_missing = ["p"]
    report.dead_letters_unexpected = ["g1", "g2"]
    assert report.problems == [
        "1 key(s) lost",
        "3 duplicate effect(s), the guarantee allows 1",
        "1 poison key(s) not dead-lettered",
        "2 good key(s) dead-lettered",
    ]
    assert not report.ok
    assert report.to_json()["lost"] == 1 and report.to_json()["lost_keys"] == ["k1"]


def test_the_messages_hold_each_key_once_its_duplicates_and_the_poison() -> None:
    plan = Plan("sqlite:///x.db", "b", messages=1000, duplicates=0.3, poison=20)
    planned = _Messages.plan(plan, "run1")
    assert len(planned.order) == 1000 and len(planned.keys) == 700
    assert {k for k, _ in planned.order} == set(planned.keys)
    assert len(planned.poison) == 20 and planned.poison <= set(planned.keys)
    assert sum(1 for _, elsewhere in planned.order if elsewhere) == 150
    assert planned == _Messages.plan(plan, "run1")  # the same run id plans the same messages
    assert planned.dropped == set()


@pytest.mark.parametrize(
    ("url", "scratch"),
    [
        ("sqlite:////var/lib/keys.db", "sqlite:////var/lib/idemctl-verify-r1.db"),
        ("sqlite:///./keys.db?synchronous=normal", "sqlite:///idemctl-verify-r1.db?synchronous=normal"),
        ("redis://:pw@h:6379/0", "redis://:pw@h:6379/0?prefix=idem:verify-r1:"),
        ("redis+cluster://h:7000?prefix=app:", "redis+cluster://h:7000?prefix=app:verify-r1:"),
        ("postgresql://u@h/db?schema=s&prefix=p_", "postgresql://u@h/db?schema=s&prefix=p_verify_r1_"),
        ("dynamodb://keys?region=eu-west-1", "dynamodb://keys-verify-r1?region=eu-west-1"),
    ],
)  # fmt: skip
def test_the_scratch_namespace_sits_beside_the_users_and_is_new(url: str, scratch: str) -> None:
    assert Scratch(url, "r1").url == scratch


def test_a_memory_store_cannot_be_shared_with_consume_processes() -> None:
    with pytest.raises(ConfigError, match="memory://"):
        Scratch("memory://", "r1")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"messages": 5}, "--messages"),
        ({"messages": 100, "poison": 20}, "--poison"),
        ({"duplicates": 0.95}, "--duplicates"),
        ({"transactional": True}, "--transactional needs a postgresql"),
        ({"sabotage": "everything"}, "--sabotage"),
        ({"run_id": "a b"}, "--run-id"),
    ],
)
def test_a_bad_plan_is_a_usage_error(changes: dict[str, object], message: str) -> None:
    plan = Plan("sqlite:///x.db", "b", **changes)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=message):
        plan.check()


def test_with_option_replaces_an_option_and_keeps_the_rest() -> None:
    assert with_option("redis://h/0?prefix=a:&lease=5s", "prefix", "b:") == (
        "redis://h/0?lease=5s&prefix=b:"
    )


def test_percentiles() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(100)], 0.99) == 99.0


def test_kills_and_rebalances_wait_for_progress_since_the_last_of_them() -> None:
    """On time while messages are handled; without one handled in between, only once
    STALLED seconds went by: a group slower to settle than --kill-every still gets work
    done, and one that stopped fetching is rebalanced again."""
    chaos = _Chaos(started=0.0, kill_every=2.0, rebalance=True)
    assert chaos.due(0.5, 10) == []  # nothing due yet
    assert chaos.due(1.0, 0) == []  # the join is due, but nothing was handled yet
    assert chaos.due(1.0, 5) == ["rebalance"]
    assert chaos.due(2.0, 5) == []  # the kill is due: nothing handled since the join
    assert chaos.due(2.1, 6) == ["kill"]
    stuck = [chaos.due(t, 6) for t in (4.2, 7.0, 10.0, 17.0)]
    assert stuck == [[], [], [], []]  # the group gets time to settle
    assert chaos.due(2.1 + STALLED, 6) == ["kill"]  # nothing for STALLED seconds: go on
    assert chaos.due(2.1 + STALLED + 0.25, 6) == []
    assert chaos.due(40.0, 7) == ["kill"]  # both due: the kill takes this progress
    assert chaos.due(40.25, 8) == ["rebalance"]
    assert chaos.due(40.25 + REBALANCE_EVERY - 0.1, 100) == ["kill"]
    assert chaos.due(40.25 + REBALANCE_EVERY, 101) == ["rebalance"]


def test_without_kills_or_rebalance_nothing_is_ever_due() -> None:
    chaos = _Chaos(started=0.0, kill_every=0.0, rebalance=False)
    assert [chaos.due(t, n) for t, n in ((1.0, 1), (10.0, 100), (1e6, 10**6))] == [[], [], []]


def children() -> set[int]:
    pgrep = ["pgrep", "-P", str(os.getpid())]
    found = subprocess.run(pgrep, capture_output=True, text=True, check=False)
    return {int(pid) for pid in found.stdout.split()}


def test_ctrl_c_while_a_consumer_starts_leaves_no_consumer_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Popen waits for the child's exec; Ctrl-C landing there must not leave a process
    verify does not know of (and so never stops)."""
    scratch: Any = SimpleNamespace(url="sqlite:///x.db")
    ledger: Any = SimpleNamespace(env="unused")
    consumers = _Consumers(PLAN, scratch, "topic", ledger, tmp_path)
    consumers.command = [sys.executable, "-c", "import time; time.sleep(60)"]

    def ctrl_c_then_slow_exec() -> None:  # in the child, while Popen waits for its exec
        os.kill(os.getppid(), signal.SIGINT)
        time.sleep(1.0)

    monkeypatch.setattr(processes, "term_with_parent", ctrl_c_then_slow_exec)
    before = children()
    # Ctrl-C as an interactive Python gets it: a run started in the background (CI's) has
    # SIGINT ignored, and Python then leaves it so.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            consumers.start_all()
    finally:
        signal.signal(signal.SIGINT, previous)
    consumers.kill_all()
    left = children() - before
    for pid in left:  # what the assertion names is stopped all the same
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert left == set()


def test_a_killed_consumers_effects_are_all_before_its_recorded_kill(tmp_path: Path) -> None:
    """judge() explains a repeated effect by a kill after it: the kill's time must be taken
    once the process is dead, not before the signal, or an effect written in between (a
    loaded machine's milliseconds) reads as unexplained (CI: "1 duplicate effect, the
    guarantee allows 0", 0 kills mid-handler). A child writing the time without pause is
    killed; every time it wrote is at most the recorded one."""
    scratch: Any = SimpleNamespace(url="sqlite:///x.db")
    ledger: Any = SimpleNamespace(env="unused")
    consumers = _Consumers(PLAN, scratch, "topic", ledger, tmp_path)
    times = tmp_path / "times.txt"
    consumers.command = [sys.executable, "-c", (
        "import sys, time\n"
        f"out = open({str(times)!r}, 'w', buffering=1)\n"
        "while True:\n    out.write(f'{time.time()!r}\\n')\n"
    )]  # fmt: skip
    try:
        consumers.running = [victim := consumers.start()]
        consumers.command = [sys.executable, "-c", "import time; time.sleep(60)"]  # its successor
        wait_until(
            lambda: times.exists() and len(times.read_text().splitlines()) >= 1000,
            "the child writes 1000 times",
            interval=0.01,
            procs=[victim],
        )
        consumers.kill_one(random.Random(0))
    finally:
        consumers.kill_all()
    written = [float(x) for x in times.read_text().splitlines()[:-1]]  # the last may be cut
    assert written and max(written) <= consumers.killed[victim.pid]
