"""paced(): the progress callback that holds a bulk operation to a rate."""

from __future__ import annotations

import pytest

from idemctl.pacing import paced


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_waits_until_the_keys_done_took_their_time() -> None:
    clock, seen = Clock(), []
    advance = paced(1000, seen.append, clock=clock, sleep=clock.sleep)
    advance(500)  # 500 keys at once: half a second is their due
    assert clock.slept == [pytest.approx(0.5)]
    clock.now += 2.0  # the next batch was slow on its own: no wait
    advance(500)
    assert clock.slept == [pytest.approx(0.5)]
    advance(2500)  # 3,500 keys by 103.5 s: due at 103.5
    assert clock.slept[-1] == pytest.approx(1.0)
    assert seen == [500, 500, 2500]


@pytest.mark.parametrize("rate", [0, -1, 2_000_000])
def test_a_rate_out_of_range_is_refused(rate: float) -> None:
    with pytest.raises(ValueError, match="above 0 and at most"):
        paced(rate)
