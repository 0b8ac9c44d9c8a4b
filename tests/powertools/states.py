"""A table holding one record in each state Powertools can leave one in, each written by
Powertools itself (tests/powertools/writers.py):

- completed: the function returned;
- in_progress: its invocation hangs with a Lambda context of 120 s left (live);
- stale: its invocation hung with 1 s left and was killed; then its in-progress expiry
  is moved 10 s into the past;
- blocked: its invocation hung with no Lambda context registered and was killed;
- expired: completed with ``expires_after_seconds=1``; then its expiry is moved 10 s into
  the past (on Redis, where its TTL deletes it at expiration, it is deleted unless
  ``keep`` persisted it).

The record's timestamps are set, not waited out: Powertools reads the wall clock.

``kill=True`` leaves the in-progress ones with a real writer process SIGKILLed inside the
function; ``kill=False`` with an invocation that dies inside the function in this process
(``crash``): the same records, without a process start.

``powertools_verdicts`` asks Powertools what it makes of each: its next call of the payload.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.powertools.writers import Job, call, hang_and_kill, key_of

if TYPE_CHECKING:
    from tests.powertools.conftest import PtTable

ALL = ("completed", "in_progress", "stale", "blocked", "expired")
STALE_MS = 1000
LIVE_MS = 120_000

REMAINING = {"in_progress": LIVE_MS, "stale": STALE_MS, "blocked": None}

VERDICT = {
    "completed": "replayed",
    "in_progress": "in_progress",
    "blocked": "in_progress",
    "stale": "ran",
    "expired": "ran",
}
"""Powertools' next call of a payload in each state: replays the stored response, refuses
(IdempotencyAlreadyInProgressError), or runs the function."""


@dataclass
class Scenario:
    table: PtTable
    jobs: dict[str, Job]
    keys: dict[str, str]

    def payload(self, state: str) -> Any:
        return self.jobs[state].payload

    def runs(self, state: str) -> int:
        return self.table.runs(self.payload(state))


def payload_for(state: str, tag: str = "") -> dict[str, Any]:
    return {"order_id": f"o-{state}{tag}", "amount": 12.5, "customer": "c-1"}


def build(
    table: PtTable,
    tmp_path: Path,
    states: tuple[str, ...] = ALL,
    *,
    kill: bool = True,
    keep: Callable[[str], None] | None = None,
    tag: str = "",
) -> Scenario:
    """One record per state in ``states`` on ``table``; returns once each state holds (the
    stale and expired ones' expiries moved into the past). ``keep(key)`` runs right after
    the expired record is written (Redis: PERSIST, or it goes as its TTL would delete
    it)."""
    tag = tag or "-" + uuid.uuid4().hex[:6]
    jobs = {s: table.job(payload_for(s, tag)) for s in states}
    if "expired" in jobs:
        jobs["expired"] = replace(jobs["expired"], expires_after_seconds=1)
        assert call(jobs["expired"]).kind == "ran"
        key = key_of(jobs["expired"])
        if keep is not None:
            keep(key)
        if table.name == "redis" and keep is None:
            table.delete(key)  # as its TTL deletes it at expiration
        else:
            table.backdate(key, **{table.attr("expiry_attr"): int(time.time()) - 10})
    if "completed" in jobs:
        assert call(jobs["completed"]).kind == "ran"
    held = [s for s in ("in_progress", "stale", "blocked") if s in jobs]
    for s in held:
        jobs[s] = replace(jobs[s], remaining_ms=REMAINING[s])
    if held and kill:
        hang_and_kill([jobs[s] for s in held], tmp_path / f"writer-{uuid.uuid4().hex[:6]}.log")
    elif held:
        for s in held:
            assert call(replace(jobs[s], mode="crash")).kind == "crashed"
    if "stale" in jobs:
        past_ms = int(time.time() * 1000) - 10_000
        table.backdate(key_of(jobs["stale"]), **{table.attr("in_progress_expiry_attr"): past_ms})
    for s in held:
        jobs[s] = replace(jobs[s], mode="complete")
    return Scenario(table, jobs, {s: key_of(j) for s, j in jobs.items()})


def powertools_verdicts(scenario: Scenario) -> dict[str, str]:
    """Powertools' next call of each payload (stale and expired ones then run and
    complete: call this last)."""
    return {state: call(job).kind for state, job in scenario.jobs.items()}
