"""Where a CPU-bound run's time goes: with ``IDEMCTL_TEST_CPU=FILE``, each test's CPU
seconds are appended to FILE as a JSON line: the worker's own, and its descendants' (the
processes a test starts, and the servers the worker started: Redis, PostgreSQL, the
broker, moto), read from /proc at the test's start and end. On 2 cores the suite runs at a
load of about 7: its wall time is its CPU time, shared out (docs/development.md). A child
that exits is counted in the test that reaps it (``subprocess`` reaps finished children
at its next start), so one test's figure may hold an earlier one's process: the files'
totals are the closer figures.

    IDEMCTL_TEST_CPU=/tmp/cpu.jsonl scripts/test
    python3 tests/cputime.py /tmp/cpu.jsonl     the tests and files that take the most
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _descendants_cpu(root: int) -> dict[int, float]:
    """CPU seconds (their own and their reaped children's) of each live descendant of
    ``root``."""
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        pid = int(entry.name)
        parent[pid] = int(fields[1])
        utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
        cpu[pid] = (utime + stime + cutime + cstime) / TICK
    out: dict[int, float] = {}
    for pid, seconds in cpu.items():
        p = parent.get(pid)
        while p is not None and p not in (0, 1):
            if p == root:
                out[pid] = seconds
                break
            p = parent.get(p)
    return out


def _own() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    log = os.environ.get("IDEMCTL_TEST_CPU")
    if not log or not os.path.isdir("/proc"):
        yield
        return
    me, wall, own = os.getpid(), time.monotonic(), _own()
    before = _descendants_cpu(me)
    yield
    after = _descendants_cpu(me)
    spawned = sum(c - before.get(pid, 0.0) for pid, c in after.items())
    line = {
        "test": item.nodeid,
        "own": round(_own() - own, 2),
        "descendants": round(spawned, 2),
        "wall": round(time.monotonic() - wall, 2),
    }
    with open(log, "a") as out:
        out.write(json.dumps(line) + "\n")


def report(path: str, top: int = 25) -> str:
    lines: list[dict[str, Any]] = [json.loads(x) for x in Path(path).read_text().splitlines()]
    total = sum(x["own"] + x["descendants"] for x in lines)
    by_file: Counter[str] = Counter()
    for x in lines:
        by_file[x["test"].split("::")[0]] += x["own"] + x["descendants"]
    out = [f"{len(lines)} tests, {total:.0f} CPU seconds"]
    out += [f"{cpu:8.1f}  {name}" for name, cpu in by_file.most_common(top)]
    out.append("")
    ranked = sorted(lines, key=lambda x: -(x["own"] + x["descendants"]))[:top]
    out += [f"{x['own'] + x['descendants']:8.1f}  {x['wall']:7.1f}s  {x['test']}" for x in ranked]
    return "\n".join(out)


if __name__ == "__main__":
    print(report(sys.argv[1]))
