"""The handlers' watchdog judged with a clock the test sets: a handler is reported once past
--stall-timeout (its stack in the warning), interrupted once past --handler-timeout (a
HandlerTimeout raised in its thread), abandoned past the hard limit; a handler under every
limit is never reported; one that returned is never interrupted."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from idemctl.consume.item import Item
from idemctl.consume.lanes import Running
from idemctl.consume.overdue import Overdue
from idemctl.errors import HandlerTimeout
from idemctl.runner.limits import cancel_interrupt, interrupt


class _Lane:
    """What the watchdog reads of a lane."""

    def __init__(self, running: Running | None) -> None:
        self.index, self.running, self.abandoned = 0, running, None
        self.lock = threading.Lock()


def _running(thread: int = 0, started: float = 100.0) -> Running:
    item = Item(None, ("t", 0), 7, key="k-7")
    return Running(item, started, thread or threading.get_ident())


def _watch(lane: Any, woken: list[int]) -> Overdue:
    return Overdue(lambda: [lane], stall=5, soft=10, hard=12, wake=lambda: woken.append(1))


def test_overdue_then_interrupted_then_abandoned(caplog: pytest.LogCaptureFixture) -> None:
    blocked, go = threading.Event(), threading.Event()
    raised: list[BaseException] = []

    def stuck() -> None:
        blocked.set()
        try:
            while not go.wait(0.01):  # Python code: an async exception lands between waits
                pass
        except HandlerTimeout as exc:
            raised.append(exc)

    thread = threading.Thread(target=stuck, daemon=True)
    thread.start()
    blocked.wait(10)
    assert thread.ident is not None
    lane = _Lane(_running(thread.ident))
    woken: list[int] = []
    watch = _watch(lane, woken)
    watch.check(104.9)
    assert watch.overdue == {} and not caplog.records
    watch.check(105.0)
    assert "handler of key 'k-7' (t[0]@7) running for 5s" in watch.overdue[0]
    assert watch.partitions == {("t", 0)}
    assert woken == [1]  # the loop hands the lane's other partitions to a spare lane
    (warning,) = caplog.records
    assert "its thread is at" in warning.getMessage() and "in stuck" in warning.getMessage()
    watch.check(106.0)
    assert len(caplog.records) == 1  # said once
    watch.check(110.0)
    thread.join(10)
    assert raised and isinstance(raised[0], HandlerTimeout)
    assert "HandlerTimeout raised" in caplog.records[-1].getMessage()
    assert lane.abandoned is None and woken == [1]  # interrupted: nothing for the loop
    watch.check(112.0)
    assert lane.abandoned is lane.running and woken == [1, 1]


def test_a_handler_under_every_limit_is_never_reported(caplog: pytest.LogCaptureFixture) -> None:
    lane = _Lane(_running())
    woken: list[int] = []
    watch = _watch(lane, woken)
    for now in (100.0, 102.0, 104.99):
        watch.check(now)
    assert watch.overdue == {} and not caplog.records and not woken
    assert not lane.running.interrupted  # type: ignore[union-attr]


def test_no_limit_no_watching() -> None:
    lane = _Lane(_running())
    watch = Overdue(lambda: [lane], stall=0, soft=0, hard=0, wake=lambda: None)  # type: ignore[list-item]
    watch.check(10**6)
    assert watch.overdue == {} and lane.abandoned is None


@pytest.mark.parametrize("taken_back", [False, True])
def test_an_interrupt_lands_when_a_blocking_call_returns_unless_taken_back(
    taken_back: bool,
) -> None:
    """A thread blocked in C gets the soft limit's HandlerTimeout when the call returns;
    one taken back before that (its handler returned meanwhile: ``Lane.returned``) never
    lands."""
    blocked, go = threading.Event(), threading.Event()
    seen: list[str] = []

    def handler() -> None:
        blocked.set()
        try:
            go.wait()
            for _ in range(100):  # bytecodes, where a pending exception would land
                pass
            seen.append("returned")
        except HandlerTimeout:
            seen.append("HandlerTimeout")

    thread = threading.Thread(target=handler, daemon=True)
    thread.start()
    blocked.wait(10)
    assert thread.ident is not None
    assert interrupt(thread.ident)
    if taken_back:
        cancel_interrupt(thread.ident)
    go.set()
    thread.join(10)
    assert seen == (["returned"] if taken_back else ["HandlerTimeout"])
