"""``@idempotent`` on ``async def``: ``idemctl.idempotent``'s arguments, results and errors,
with what it makes of a call's arguments and of its result shared with it."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from idemctl.aio.attempt import run
from idemctl.runner.decorator import Calls, answer, check_order

if TYPE_CHECKING:
    from idemctl.aio.store import AsyncStore

P = ParamSpec("P")
T = TypeVar("T")


def idempotent(
    store: AsyncStore | str,
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
) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
    """``idemctl.idempotent`` for ``async def`` functions: the same arguments, results and
    errors; ``store`` is an ``AsyncStore`` or a URL opened on first call."""
    check_order(order_key, sequence)

    def decorate(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
        calls = Calls(fn, key, fingerprint, order_key, sequence)
        opened: list[AsyncStore] = []

        def the_store() -> AsyncStore:
            if not isinstance(store, str):
                return store
            if not opened:
                from idemctl.aio import open_store

                opened.append(open_store(store))
            return opened[0]

        @functools.wraps(fn)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            k, fp, order = calls.of(args, kwargs)
            result = await run(
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
