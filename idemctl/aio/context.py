"""How an async attempt hands its Context to a handler: ``idemctl.runner.context``'s
``call_handler`` for coroutines."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from idemctl.runner.context import Context, entered

Handler = Callable[[Context], Awaitable[Any] | Any]
"""``async def handler(ctx) -> JSON``; a plain function works too (it blocks the loop)."""


async def call_handler(ctx: Context, handler: Handler) -> Any:
    """The handler's value, awaited if it is a coroutine, with ``current_context()`` set."""
    with entered(ctx):
        value = handler(ctx)
        if inspect.isawaitable(value):
            value = await value
        return value
