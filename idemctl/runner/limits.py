"""Time limits on a handler running in a thread of its own (``consume --handler-timeout``).

- the soft limit raises ``HandlerTimeout`` in the handler's thread (dramatiq's and Celery's
  way, ``PyThreadState_SetAsyncExc``): Python code stops at its next bytecode, a blocking C
  call (a socket read without a timeout, ``time.sleep``) only when it returns;
- past the hard limit the thread is *abandoned*: whoever ran it settles its key without
  it, and should it ever return, ``Abandoned`` unwinds it without touching the key again.

``DEADLINES`` is the soft limit of ``run(..., timeout=)`` and ``@idempotent(timeout=)``:
one thread for the process, started by the first deadline, raises ``HandlerTimeout`` in
each thread whose deadline passed before it was disarmed. A HandlerTimeout that falls as
the handler returns may land in idemctl's own code after it: the attempt then counts as
failed (and is retried), as with dramatiq's and Celery's soft limits.
"""

from __future__ import annotations

import ctypes
import heapq
import itertools
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

from idemctl.errors import HandlerTimeout


class Abandoned(BaseException):
    """Raised in a thread that was abandoned past its hard time limit once its handler
    returns: nothing of the attempt may be recorded by it any more."""


def interrupt(thread_id: int) -> bool:
    """Raise ``HandlerTimeout`` in the thread ``thread_id`` at its next bytecode; False when
    no such thread runs."""
    found: int = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(HandlerTimeout)
    )
    return found == 1


def cancel_interrupt(thread_id: int) -> None:
    """Take back an ``interrupt`` not delivered yet (the handler returned meanwhile)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), None)


def stack_of(thread_id: int, limit: int = 12) -> str:
    """Where the thread ``thread_id`` is now: its innermost ``limit`` frames, as a traceback
    prints them (empty once the thread is gone)."""
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return ""
    return "".join(traceback.format_stack(frame)[-limit:]).rstrip()


@dataclass(order=True)
class Armed:
    """One thread's deadline (``Deadlines.arm``)."""

    at: float
    seq: int
    thread: int = field(compare=False)
    done: bool = field(default=False, compare=False)
    fired: bool = field(default=False, compare=False)
    """HandlerTimeout was raised in the thread."""


class Deadlines:
    """Raises ``HandlerTimeout`` in threads whose deadline passed, from one thread."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[Armed] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float) -> Armed:
        """HandlerTimeout in the calling thread ``seconds`` from now, unless disarmed."""
        armed = Armed(time.monotonic() + seconds, next(self._seq), threading.get_ident())
        with self._cond:
            heapq.heappush(self._heap, armed)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="idemctl-deadlines", daemon=True
                )
                self._thread.start()
            if self._heap[0] is armed:
                self._cond.notify()
        return armed

    def disarm(self, armed: Armed) -> None:
        """The handler returned: no HandlerTimeout now, and none pending."""
        with self._cond:
            armed.done = True
            if armed.fired:
                cancel_interrupt(armed.thread)

    def _watch(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0].done:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                left = self._heap[0].at - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                armed = heapq.heappop(self._heap)
                armed.fired = interrupt(armed.thread)


DEADLINES = Deadlines()
