"""The tests' one way to wait for something that happens on its own: poll a condition every
``interval`` seconds until it holds, and fail after ``timeout`` seconds naming what was
awaited. The timeout is a deadline for a hung run, not a speed: a slow machine only waits
longer. The only sleeps in the tests that wait are the poll intervals here.

``procs``: processes the condition depends on; one that exits first fails the wait at once
(rather than at the deadline), with ``detail()`` (its log, say) in the message.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

DEADLINE = 60.0
"""Seconds a test waits, by default, for something that happens on its own."""
INTERVAL = 0.05
"""Seconds between two looks, by default."""


class Polled(Protocol):
    """A process: ``subprocess.Popen`` or anything else with ``poll()`` and ``returncode``."""

    returncode: Any

    def poll(self) -> Any: ...


def _check_procs(procs: Iterable[Polled], what: str, detail: Callable[[], str] | None) -> None:
    for proc in procs:
        if proc.poll() is not None:
            args = getattr(proc, "args", proc)
            raise AssertionError(
                f"{args!r} exited ({proc.returncode}) before: {what}"
                + (f"\n{detail()}" if detail else "")
            )


def _fail(what: str, timeout: float, detail: Callable[[], str] | None) -> AssertionError:
    return AssertionError(f"not within {timeout:g} s: {what}" + (f"\n{detail()}" if detail else ""))


def wait_until(
    condition: Callable[[], T],
    what: str,
    timeout: float = DEADLINE,
    interval: float = INTERVAL,
    procs: Iterable[Polled] = (),
    detail: Callable[[], str] | None = None,
) -> T:
    """``condition()``'s first truthy answer, looked for every ``interval`` seconds; an
    AssertionError naming ``what`` after ``timeout`` seconds, or as soon as one of ``procs``
    has exited."""
    procs = list(procs)
    deadline = time.monotonic() + timeout
    while True:
        answer = condition()
        if answer:
            return answer
        _check_procs(procs, what, detail)
        if time.monotonic() >= deadline:
            raise _fail(what, timeout, detail)
        time.sleep(interval)


async def wait_until_async(
    condition: Callable[[], T | Awaitable[T]],
    what: str,
    timeout: float = DEADLINE,
    interval: float = INTERVAL,
    procs: Iterable[Polled] = (),
    detail: Callable[[], str] | None = None,
) -> T:
    """``wait_until`` for a coroutine: the event loop runs on between two looks, and
    ``condition`` may be a coroutine function."""
    procs = list(procs)
    deadline = time.monotonic() + timeout
    while True:
        answer = condition()
        if inspect.isawaitable(answer):
            answer = await answer
        if answer:
            return answer  # type: ignore[return-value]
        _check_procs(procs, what, detail)
        if time.monotonic() >= deadline:
            raise _fail(what, timeout, detail)
        await asyncio.sleep(interval)
