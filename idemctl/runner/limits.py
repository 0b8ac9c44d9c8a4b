"""Time limits on a handler running in a thread of its own (``consume --handler-timeout``).

- the soft limit raises ``HandlerTimeout`` in the handler's thread (dramatiq's and Celery's
  way, ``PyThreadState_SetAsyncExc``): Python code stops at its next bytecode, a blocking C
  call (a socket read without a timeout, ``time.sleep``) only when it returns;
- past the hard limit the thread is *abandoned*: whoever ran it settles its key without
  it, and should it ever return, ``Abandoned`` unwinds it without touching the key again.
"""

from __future__ import annotations

import ctypes
import sys
import traceback

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
