"""``wait=`` across processes, on a server each process opens by URL: 2 processes of 10
threads call one key; its handler runs once and all 20 calls get its result. With the
holder SIGKILLed mid-run, a waiter takes the key over once its lease ends (the test ends
it, on the store's clock) and runs it once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from idemctl import open_store
from tests.backends import BACKENDS, FAMILIES, expire_lease
from tests.polling import wait_until

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]


def start(url: str, key: str, ledger: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.wait.worker", url, key, str(ledger), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def results(procs: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        found += json.loads(out)
    return found


def ledger_lines(ledger: Path) -> list[str]:
    return ledger.read_text().splitlines() if ledger.exists() else []


@pytest.fixture(params=FAMILIES)
def url(request: pytest.FixtureRequest) -> str:
    backend = BACKENDS[request.param](request)
    backend.reset()
    with open_store(backend.url) as store:
        store.provision()
    return backend.url


def test_twenty_callers_in_two_processes_run_the_key_once(url: str, tmp_path: Path) -> None:
    key, ledger = f"wait-{uuid.uuid4().hex[:8]}", tmp_path / "ledger.txt"
    procs = [start(url, key, ledger) for _ in range(2)]
    found = results(procs)
    assert len(ledger_lines(ledger)) == 1, ledger_lines(ledger)
    outcomes = sorted(r["outcome"] for r in found)
    assert outcomes == ["executed"] + ["replayed"] * 19
    assert len({json.dumps(r["result"], sort_keys=True) for r in found}) == 1  # one result


def test_a_waiter_takes_over_from_a_killed_holder_and_runs_once(url: str, tmp_path: Path) -> None:
    key, ledger = f"wait-{uuid.uuid4().hex[:8]}", tmp_path / "ledger.txt"
    holder = start(url, key, ledger, "--hold")
    wait_until(
        lambda: ledger_lines(ledger),
        "the holder's handler has begun",
        interval=0.02,
        procs=[holder],
        detail=lambda: holder.communicate()[1][-2000:],
    )
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    procs = [start(url, key, ledger, "--wait", "60") for _ in range(2)]
    with open_store(url) as store:
        wait_until(
            lambda: (record := store.get(key)) is not None and record.attempts >= 1,
            f"{key} is claimed",
            interval=0.02,
        )
        expire_lease(store, key)  # the killed holder's lease is over now
    found = results(procs)
    lines = ledger_lines(ledger)
    assert len(lines) == 2 and lines[1].endswith(" 2"), lines  # the holder's, then one takeover
    assert sorted(r["outcome"] for r in found) == ["executed"] + ["replayed"] * 19
    assert {r["result"]["attempt"] for r in found} == {2}
