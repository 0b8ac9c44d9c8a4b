"""Child processes idemctl starts (verify's consumers, consume's workers): tied to the
process that started them, and named so that ``ps`` and ``top`` tell them apart. Linux's
prctl where it is there; a no-op elsewhere."""

from __future__ import annotations

import signal
import sys
from contextlib import suppress
from typing import Any

_PRCTL: Any = None
if sys.platform == "linux":
    import ctypes

    with suppress(OSError, AttributeError):
        _PRCTL = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not in the child

PR_SET_NAME = 15
PR_SET_PDEATHSIG = 1


def term_with_parent() -> None:
    """In the child, before exec (``preexec_fn``): SIGTERM when the thread that started it
    dies. It only calls prctl, looked up beforehand: no import, lock or log in the child
    that another thread could hold at the fork."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


def set_name(name: str) -> None:
    """This process's name as ``ps -o comm`` and ``top`` show it (15 bytes at most)."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_NAME, name.encode()[:15])
