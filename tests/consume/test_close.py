"""consume's close is bounded: librdkafka's synchronous commit and its close wait without
a bound (CI saw a worker wait for ever inside the close's revoke callback, so SIGTERM never
ended it), so they run under ``idemctl.consume.watch.within``, which stops waiting."""

from __future__ import annotations

import logging
import threading

import pytest

from idemctl.consume.watch import within


def test_a_call_that_finishes_is_waited_for() -> None:
    seen: list[str] = []
    assert within(lambda: seen.append(threading.current_thread().name), 60, "the close")
    assert seen == ["idemctl-close"]


def test_a_call_that_raises_raises_in_the_caller() -> None:
    def fail() -> None:
        raise RuntimeError("broker gone")

    with pytest.raises(RuntimeError, match="broker gone"):
        within(fail, 60, "the close")


def test_a_call_that_never_returns_is_left_behind_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()
    with caplog.at_level(logging.WARNING, "idemctl.consume"):
        assert within(release.wait, 0.05, "the final commit and leaving the group") is False
    (warning,) = caplog.records
    assert warning.getMessage().startswith(
        "the final commit and leaving the group did not finish within 0.05s"
    )
    (left,) = [t for t in threading.enumerate() if t.name == "idemctl-close"]
    assert left.daemon  # it cannot keep the process from exiting
    release.set()
    left.join(10)
