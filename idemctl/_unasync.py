"""The one escape of code written once, for asyncio (scripts/unasync.py).

``if is_async(): <async-only> else: <sync-only>`` runs its first branch in the async
original; the sync module written from it holds only the ``else`` branch (the test is gone,
and so is this import), as it does for ``if is_async() and ...:``; ``a if is_async() else
b`` becomes ``b``. Kept for the few lines that must differ: a timer on the event loop or in
a thread, a shielded give-back or a plain call, a pause slept on the loop or in the thread.
"""

from __future__ import annotations

from typing import Literal


def is_async() -> Literal[True]:
    """True: the code that asks is the async original (its sync module never asks). Typed
    ``Literal[True]``, so mypy takes the ``else`` branch for unreachable in the original and
    checks it in the sync module, where it runs."""
    return True
