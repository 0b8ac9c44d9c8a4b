"""``idemctl verify --fenced``: the recording handler writes its effect through the fence
into a ledger of its own, with a consumer SIGKILLed every 2 s: no duplicate effect is the
guarantee it checks, and each key's standing effect is its completing attempt's."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from idemctl.harness.verify.plan import Plan, fence_mismatches, guarantee_of
from tests.servers import KafkaBroker
from tests.verify.test_verify import left_behind, target, validate, verify


@pytest.mark.parametrize("name", ["sqlite", "redis", "postgres"])
def test_verify_fenced_with_kills_every_2s_finds_no_duplicate_effect(
    kafka_broker: KafkaBroker, request: pytest.FixtureRequest, tmp_path: Path, name: str
) -> None:
    t = target(name, request, tmp_path)
    run = uuid.uuid4().hex[:8]
    rc, doc, err = verify(
        kafka_broker, t.url, "--messages", "600", "--kill-every", "2s", "--fenced",
        "--run-id", run,
    )  # fmt: skip
    shown = {k: doc.get(k) for k in ("problems", "lost", "duplicate_effects", "kills",
                                     "effects_replaced", "late_writes_refused")}  # fmt: skip
    print(f"verify --fenced on {name}: {shown}")
    assert rc == 0, f"{shown}\n{err[-3000:]}"
    validate("verify.schema.json", doc)
    assert doc["ok"] is True and doc["mode"] == "fenced effects" and doc["fenced"] is True
    assert doc["duplicate_effects"] == 0 == doc["duplicates_allowed"]
    assert doc["lost"] == 0 and doc["lag_left"] == 0 and doc["fence_mismatches"] == []
    assert doc["effects"] == doc["keys"]  # one standing effect a key
    assert doc["kills"] >= 1, err[-2000:]
    assert doc["effects_replaced"] >= 0 and doc["late_writes_refused"] >= 0
    assert left_behind(kafka_broker, t.url, run) == (set(), 0)
    assert list(tmp_path.glob("idemctl-verify-*")) == []


def test_a_standing_effect_of_another_attempt_is_a_mismatch() -> None:
    """What --fenced judges, alone: an effect whose token is not the completing attempt's
    (a stale write that landed) or whose key never completed is named."""
    completed = {"k-1": 7, "k-2": 9}
    tokens = {"k-1": 7, "k-2": 8, "k-3": 4}
    assert fence_mismatches(tokens, completed.get) == ["k-2", "k-3"]
    assert fence_mismatches({"k-1": 7}, completed.get) == []


def test_fenced_is_its_own_mode_and_not_with_transactional() -> None:
    mode, guarantee = guarantee_of(Plan("sqlite:///x.db", "", fenced=True))
    assert mode == "fenced effects" and "no duplicate effect" in guarantee
    with pytest.raises(Exception, match="choose one"):
        Plan("postgresql://h/db", "", fenced=True, transactional=True).check()
