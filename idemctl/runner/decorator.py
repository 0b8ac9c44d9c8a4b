# Written by scripts/unasync.py from idemctl/aio/decorator.py.
# Do not edit: change that file and run the script (scripts/test checks the two agree).
"""``@idempotent``: a function made to run at most once to completion per key, with the
same arguments, results and errors for plain and ``async def`` functions.

Written by scripts/unasync.py from ``idemctl.aio.decorator``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from idemctl.runner.attempt import run
from idemctl.runner.calls import Calls, answer, check_order

if TYPE_CHECKING:
    from idemctl.stores.base import Store
P = ParamSpec("P")
T = TypeVar("T")


def idempotent(
    store: Store | str,
    *,
    key: str | Callable[..., str],
    fingerprint: bool | Callable[..., Any] = True,
    lease: float | None = None,
    retention: float | None = None,
    permanent: tuple[type[BaseException], ...] = (),
    order_key: str | Callable[..., str] | None = None,
    sequence: str | Callable[..., Any] | None = None,
    timeout: float | None = None,
    wait: float | None = None,
) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Make a function run at most once to completion per idempotency key. ``store`` is a
    store, or a URL opened on first call.

    ``key`` is a template over the function's arguments (``"charge:{order_id}"``) or a
    function of them. ``fingerprint`` guards against reusing a key with other arguments:
    True fingerprints all arguments (they must be JSON-serializable), a function picks
    what to fingerprint, False turns the check off. A repeated call returns the stored
    (JSON) result without running the function; see ``idemctl.errors`` for what it raises
    when the key is busy, mismatched or failed before.

    ``order_key`` (a template or function like ``key``: the entity) and ``sequence`` (the
    name of the argument holding it, or a function of the arguments) add the sequence
    guard: a call whose sequence is not above the entity's last applied one does not run
    and raises StaleEvent. Sequences are whole numbers or ISO 8601 timestamps.

    ``timeout`` (seconds): past it, HandlerTimeout is raised inside the function (at its
    next bytecode; a blocking C call sees it when it returns) and propagates from the call;
    the key is failed as retriable, so the next call runs it again.

    ``wait`` (seconds): a call that finds its key in flight waits up to ``wait`` for the
    holder instead of raising KeyBusy at once: it returns the holder's result, or runs the
    function itself if the holder failed, let go or lost its lease; KeyBusy at the deadline.
    """
    check_order(order_key, sequence)

    def decorate(fn: Callable[P, T]) -> Callable[P, T]:
        calls = Calls(fn, key, fingerprint, order_key, sequence)
        opened: list[Store] = []

        def the_store() -> Store:
            if not isinstance(store, str):
                return store
            if not opened:
                from idemctl.stores import open_store

                opened.append(open_store(store))
            return opened[0]

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            k, fp, order = calls.of(args, kwargs)
            result = run(
                the_store(),
                k,
                lambda _ctx: fn(*args, **kwargs),
                fingerprint=fp,
                lease=lease,
                retention=retention,
                permanent=permanent,
                timeout=timeout,
                order=order,
                wait=wait,
            )
            value: T = answer(result, order)
            return value

        return wrapper

    return decorate
