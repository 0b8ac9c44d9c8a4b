"""A refused fenced write ends its attempt as a lost key in every engine that runs handlers:
``run``, ``@idempotent``, ``idemctl.aio.run`` and the batch consume runs on. Each handler
plays a zombie: its lease runs out by the store's clock, another attempt takes the key
over and charges a SQLite ledger through the fence, then the zombie's own charge comes.
Not retried, not failed, logged; the ledger keeps the taker's charge."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from typing import Any

import pytest

from idemctl import StaleFence, idempotent, run
from idemctl import aio as idem_aio
from idemctl.fence import Fence
from idemctl.fence.sql import add_fence_columns, fenced_insert
from idemctl.model import Acquired, ClaimRequest, Status
from idemctl.runner import Batch, Context, Outcome, current_context
from idemctl.stores.memory import MemoryStore
from tests.runner.test_runner import Clock

LEASE = 5.0


class Scene:
    """A store on a hand-driven clock, a fenced ledger, and the takeover a zombie meets."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.store = MemoryStore(clock=self.clock)
        self.ledger = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        self.ledger.execute("CREATE TABLE charges (payment TEXT PRIMARY KEY, cents INTEGER)")
        add_fence_columns(self.ledger, "charges")
        self.calls = 0
        self.taker = 0

    def charge(self, fence: Fence) -> None:
        row = {"payment": fence.key, "cents": 100}
        fenced_insert(self.ledger, "charges", row, fence, unique=("payment",))

    def zombie(self, ctx: Context) -> str:
        """The handler: stopped past its lease, taken over, then it charges."""
        self.calls += 1
        self.clock.advance(LEASE + 1)
        taken = self.store.claim(ctx.key, None, 30)
        assert isinstance(taken, Acquired) and taken.takeover
        self.taker = taken.fencing_token
        self.charge(Fence(ctx.key, taken.fencing_token))
        self.store.complete(ctx.key, taken.owner, taken.fencing_token, "the taker's")
        self.charge(ctx.fence)  # raises StaleFence
        return "the zombie's"

    def landed(self) -> list[tuple[Any, ...]]:
        return self.ledger.execute("SELECT payment, idemctl_token FROM charges").fetchall()

    def settled(self, key: str) -> None:
        record = self.store.get(key)
        assert record is not None and record.status is Status.COMPLETED
        assert record.result == "the taker's" and record.attempts == 2  # no failure recorded
        assert self.calls == 1  # not retried
        assert self.landed() == [(key, self.taker)]


def refused_in(caplog: pytest.LogCaptureFixture, key: str) -> bool:
    return any(
        r.levelno == logging.WARNING
        and getattr(r, "idemctl", {}).get("outcome") == "fence_refused"
        and f"refused for key {key!r}" in r.getMessage()
        for r in caplog.records
    )


def test_run_ends_the_zombie_as_lease_lost(caplog: pytest.LogCaptureFixture) -> None:
    scene = Scene()
    result = run(scene.store, "pay-1", scene.zombie, lease=LEASE, heartbeat=False)
    assert result.outcome is Outcome.LEASE_LOST and isinstance(result.error, StaleFence)
    assert result.error.last == scene.taker
    scene.settled("pay-1")
    assert refused_in(caplog, "pay-1")


def test_idempotent_raises_the_stale_fence_to_its_caller() -> None:
    scene = Scene()

    @idempotent(scene.store, key="pay-{order}", lease=LEASE)  # done in a third of a lease: no beat
    def pay(order: str) -> str:
        ctx = current_context()
        assert ctx.fence == Fence(ctx.key, ctx.fencing_token)
        return scene.zombie(ctx)

    with pytest.raises(StaleFence):
        pay("2")
    scene.settled("pay-2")
    assert pay("2") == "the taker's"  # a redelivery replays the taker's result


def test_aio_run_ends_the_zombie_as_lease_lost() -> None:
    scene = Scene()

    async def handler(ctx: Context) -> str:
        return scene.zombie(ctx)

    async def main() -> Any:
        store = idem_aio.wrap(scene.store)
        return await idem_aio.run(store, "pay-3", handler, lease=LEASE, heartbeat=False)

    result = asyncio.run(main())
    assert result.outcome is Outcome.LEASE_LOST
    scene.settled("pay-3")


def test_the_batch_consume_runs_on_ends_the_zombie_as_lease_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    scene = Scene()
    with Batch(scene.store, lease=LEASE) as batch:
        for ahead in batch.start_round([ClaimRequest("pay-4")], []):
            ahead.take()
        result = batch.run("pay-4", scene.zombie)
        assert result.outcome is Outcome.LEASE_LOST and not result.retriable
        assert batch.end_round() == []  # nothing of the zombie's to complete
    scene.settled("pay-4")
    assert refused_in(caplog, "pay-4")
