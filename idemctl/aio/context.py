"""How an async attempt hands its Context to a handler: ``idemctl.runner.context``'s
``call_handler`` for coroutines."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from idemctl.errors import HandlerTimeout
from idemctl.runner.context import Context, entered, timed_out

Handler = Callable[[Context], Awaitable[Any] | Any]
"""``async def handler(ctx) -> JSON``; a plain function works too (it blocks the loop)."""


async def call_handler(ctx: Context, handler: Handler, timeout: float | None = None) -> Any:
    """The handler's value, awaited if it is a coroutine, with ``current_context()`` set;
    a coroutine still running after ``timeout`` seconds is cancelled: HandlerTimeout."""
    with entered(ctx):
        value = handler(ctx)
        if not inspect.isawaitable(value):
            return value
        if timeout is None:
            return await value
        limit = asyncio.timeout(timeout)
        try:
            async with limit:
                return await value
        except TimeoutError:
            if not limit.expired():
                raise  # the handler's own
            raise HandlerTimeout(timed_out(timeout)) from None
