"""``wait=``: a call that finds its key in flight waits for the holder, on every store and
both APIs. The holder here is the test itself (a claim it settles when the waiter is
registered), so each case is decided by the store, never by how fast the machine is."""

from __future__ import annotations

import time

import pytest

from idemctl.errors import ConfigError
from idemctl.model import Acquired
from idemctl.runner import Outcome
from idemctl.stores.base import Store
from idemctl.stores.waiting import STATS
from tests.backends import expire_lease
from tests.contract.api import run, waiting

pytestmark = pytest.mark.timeout(120)


def held(store: Store, key: str) -> Acquired:
    claimed = store.claim(key, lease=600)
    assert isinstance(claimed, Acquired)
    return claimed


def test_a_waiter_gets_the_holders_result(store: Store) -> None:
    a = held(store, "w-done")
    begun = STATS.begun
    future, ran = waiting(store, "w-done")
    store.complete("w-done", a.owner, a.fencing_token, {"ran": "holder"})
    result = future.result(timeout=60)
    assert result.outcome is Outcome.REPLAYED and result.result == {"ran": "holder"}
    assert ran == []
    assert STATS.begun > begun


@pytest.mark.parametrize("how", ["release", "fail"])
def test_a_waiter_runs_the_key_when_the_holder_lets_go(store: Store, how: str) -> None:
    a = held(store, "w-free")
    future, ran = waiting(store, "w-free")
    if how == "release":
        store.release("w-free", a.owner, a.fencing_token)
    else:
        store.fail("w-free", a.owner, a.fencing_token, "boom", retriable=True)
    result = future.result(timeout=60)
    assert result.outcome is Outcome.EXECUTED and result.result == {"ran": "waiter"}
    assert ran == ["w-free"] and result.attempt == 2


def test_a_waiter_takes_over_when_the_lease_ends(store: Store) -> None:
    """The holder died (no settle, no message): the lease running out wakes the waiter."""
    held(store, "w-dead")
    future, ran = waiting(store, "w-dead")
    expire_lease(store, "w-dead")
    result = future.result(timeout=60)
    assert result.outcome is Outcome.EXECUTED and ran == ["w-dead"]
    record = store.get("w-dead")
    assert record is not None and record.fencing_token == result.fencing_token


def test_a_permanent_failure_is_answered_not_waited_out(store: Store) -> None:
    a = held(store, "w-perm")
    future, ran = waiting(store, "w-perm")
    store.fail("w-perm", a.owner, a.fencing_token, "bad input", retriable=False)
    result = future.result(timeout=60)
    assert result.outcome is Outcome.FAILED and ran == []


def test_still_in_flight_at_the_deadline_is_busy(store: Store) -> None:
    held(store, "w-busy")
    timed_out = STATS.timed_out
    started = time.monotonic()
    result = run(store, "w-busy", lambda ctx: "never", wait=0.3)
    assert result.outcome is Outcome.BUSY
    assert time.monotonic() - started >= 0.3
    assert STATS.timed_out > timed_out
    assert "w-busy" not in store.watch().waited  # nothing left registered


@pytest.mark.parametrize("wait", [0, -1, 1e9])
def test_wait_out_of_range_is_refused_before_any_claim(store: Store, wait: float) -> None:
    with pytest.raises(ConfigError, match="wait"):
        run(store, "w-range", lambda ctx: "x", wait=wait)
    assert store.get("w-range") is None


def test_the_waits_show_in_prometheus(store: Store) -> None:
    """``register_waits``: the process's waits in an application's registry, as scraped."""
    from prometheus_client import CollectorRegistry, generate_latest

    from idemctl.metrics import register_waits

    registry = CollectorRegistry()
    register_waits(registry)
    held(store, "w-metrics")
    assert run(store, "w-metrics", lambda ctx: "x", wait=0.05).outcome is Outcome.BUSY
    text = generate_latest(registry).decode()
    values = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert values["idemctl_waits_begun_total"] >= 1
    assert values['idemctl_waits_ended_total{how="timed_out"}'] >= 1
    assert values['idemctl_wait_seconds_bucket{le="+Inf"}'] == values["idemctl_wait_seconds_count"]
    assert values["idemctl_wait_seconds_count"] >= 1
